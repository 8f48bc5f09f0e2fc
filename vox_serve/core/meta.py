"""Program meta and engine limits: plain data that schedulers read (no torch here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProgramMeta:
    """What a runtime needs to know about a model without reading its code."""

    name: str
    sample_rate: int
    input_columns: int  # ids per input position
    codes_per_step: int  # ids sampled per decode row
    codes_per_frame: int  # audio codes per codec frame
    samples_per_frame: int
    frames_per_chunk: int  # default detokenize interval
    codec_lookback_frames: int
    codec_lookahead_frames: int
    skip_leading_frames: int  # frames whose audio is never emitted (no lookback exists for them)
    max_model_len: int
    max_text_chars: int
    stop_rule: str
    default_sampling: dict[str, Any]
    accepted_fields: tuple[str, ...]
    voices: tuple[str, ...] = ()
    default_voice: str | None = None
    languages: tuple[str, ...] = ()
    supports_input_streaming: bool = False
    # Incremental input streaming: the input column that carries one streamed text id per generated
    # token row (a frame, for Qwen3-TTS); the program splits the text into prompt + trailing ids
    # (text_sessions.TextStreaming). None: the whole text goes into the prompt, and an
    # input-streaming request starts once its text has ended.
    streamed_text_column: int | None = None
    stateful_codec: bool = False
    # > 0: prompt positions may carry a vector of this width added to their input embedding (a speaker
    # embedding); the prefill arena then has `embed_rows` / `embeds` fields.
    prompt_embed_dim: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def codec_window(self, frames_per_chunk: int) -> int:
        return self.codec_lookback_frames + frames_per_chunk + self.codec_lookahead_frames

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EngineLimits:
    """Static sizes of the arenas and the KV cache."""

    max_batch: int
    max_prefill_tokens: int
    max_prefill_seqs: int
    max_codec_batch: int
    frames_per_chunk: int
    num_pages: int
    page_size: int
    max_model_len: int
    repetition_window: int = 64
    num_codec_slots: int = 0  # streaming-state slots of a stateful codec (0: twice max_batch)
    first_chunk_frames: int = 0  # frames of a request's first audio chunk (0: frames_per_chunk)

    @property
    def first_frames(self) -> int:
        return self.first_chunk_frames or self.frames_per_chunk

    @property
    def has_first_chunks(self) -> bool:
        """Whether first chunks are smaller than the others (their own codec arenas and graphs)."""
        return self.first_frames < self.frames_per_chunk

    @property
    def codec_slots(self) -> int:
        return self.num_codec_slots or 2 * self.max_batch

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_model_len // self.page_size)

"""Program meta and engine limits: plain data that schedulers and runtimes read (no torch here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# A request's codec prefix (`ProgramLayout.codec_prefix_frames`): `Prompt.conditioning[CODEC_PREFIX]`,
# frames [n, codes_per_frame] of integer codes; in step_in `codec_prime_codes` / `codec_prime_len`.
CODEC_PREFIX = "codec_prefix"


@dataclass(frozen=True)
class SlotField:
    """A per-slot input a program declares: set once when a request is admitted (e.g. a speaker
    embedding or a prompt mel that conditions the codec), from `Prompt.conditioning[name]`."""

    name: str
    shape: tuple[int, ...]  # per slot; a request's value may be shorter in its first dimension
    dtype: str = "float32"


@dataclass(frozen=True)
class ProgramLayout:
    """What a program's arenas hold beyond the common LM and codec fields (docs/engine-contract.md)."""

    prompt_vector_dim: int = 0  # > 0: prompt positions may carry vectors added to their input embedding
    max_prompt_vectors: int = 0  # prompt vectors one prefill launch holds (0: max_prefill_tokens)
    slot_fields: tuple[SlotField, ...] = ()
    frame_latent_dim: int = 0  # > 0: each generated frame leaves a float vector that codec windows read
    # > 0: a request's codec stream may start with up to this many frames that are decoded but never
    # emitted (a voice clone's reference frames): its codec slot is primed with them once, in the step
    # that admits it (the `codec_prime` stage), from `Prompt.conditioning[CODEC_PREFIX]`.
    codec_prefix_frames: int = 0
    # Paired rows (classifier-free guidance): a request owns this many KV sequences of equal length (2:
    # conditional and unconditional); every LM row attends each of them, and the program mixes their
    # logits into one sample. 1 (the default) is one sequence per request.
    kv_streams: int = 1


@dataclass(frozen=True)
class StopRule:
    """When a request stops, as the stages decide it (inside the graph); published for runtimes and docs.
    A sampled `token` in `column` stops the request, once `min_generated` tokens exist, at a frame
    boundary when `at_frame_boundary` (also: max_tokens, max_model_len, decided by the host). With
    `keeps_frame` the stopping row is audio too (OutKind.AUDIO_STOP); `description` says it in words
    for a rule that is not one token (CSM: codebooks 0..30 all zero)."""

    token: int
    column: int = 0
    min_generated: int = 0
    at_frame_boundary: bool = False
    keeps_frame: bool = False
    description: str = ""


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
    stop_rule: StopRule
    default_sampling: dict[str, Any]
    accepted_fields: tuple[str, ...]
    # JSON schemas of the request fields this model defines itself, or types otherwise than the common
    # table (`api/schemas.REQUEST_FIELDS`); `type` says how a value is checked (`request_builder`) and how a
    # form value is read. CSM: `speaker` (an integer id), `context` (earlier turns), depth-decoder sampling.
    field_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
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
    # The codec pads at the sequence end as a one-shot decode does (DAC: window frames past the end are
    # masked), so a final chunk emits every frame up to the last, not only those with lookahead.
    codec_pads_end: bool = False
    layout: ProgramLayout = field(default_factory=ProgramLayout)
    # What a prompt builder outside Python needs: tokenizer file, special ids, templates per request
    # kind (the program's `prompt_builder_spec`); empty when prompts need the program's Python code.
    prompt_builder: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def codec_window(self, frames_per_chunk: int) -> int:
        return self.codec_lookback_frames + frames_per_chunk + self.codec_lookahead_frames

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProgramMeta:
        """The inverse of `to_dict`, also after JSON or msgpack (lists back to tuples)."""
        tuples = ("accepted_fields", "voices", "languages")
        values = {k: tuple(v) if k in tuples else v for k, v in data.items()}
        values["stop_rule"] = StopRule(**data["stop_rule"])
        layout = dict(data.get("layout", {}))
        layout["slot_fields"] = tuple(SlotField(f["name"], tuple(f["shape"]), f.get("dtype", "float32"))
                                      for f in layout.get("slot_fields", ()))
        values["layout"] = ProgramLayout(**layout)
        return cls(**values)


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
    num_slots: int = 0  # request slots: device state of admitted requests (0: twice max_batch)
    first_chunk_frames: int = 0  # frames of a request's first audio chunk (0: frames_per_chunk)
    kv_streams: int = 1  # KV sequences per request: the program's `ProgramLayout.kv_streams`

    @property
    def first_frames(self) -> int:
        return self.first_chunk_frames or self.frames_per_chunk

    @property
    def has_first_chunks(self) -> bool:
        """Whether first chunks are smaller than the others (their own codec arenas and graphs)."""
        return self.first_frames < self.frames_per_chunk

    @property
    def slots(self) -> int:
        return self.num_slots or 2 * self.max_batch

    @property
    def max_page_updates(self) -> int:
        """Page-table entries one step may write: a full prefill's pages, one per sequence boundary and
        one per decode row, for each KV stream."""
        per_stream = -(-self.max_prefill_tokens // self.page_size) + self.max_prefill_seqs + self.max_batch
        return self.kv_streams * per_stream

    @property
    def max_admits(self) -> int:
        """Requests one step may admit (each starts with a prefill)."""
        return self.max_prefill_seqs

    @property
    def max_pages_per_seq(self) -> int:
        """Pages of one KV sequence (one stream); a slot's page-table row holds kv_streams of them."""
        return -(-self.max_model_len // self.page_size)

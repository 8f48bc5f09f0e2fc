"""Per-request state: one Request object with one status enum (pure Python, no torch)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, no KV pages yet
    RUNNING = "running"  # admitted: prefilling or decoding tokens
    DRAINING = "draining"  # tokens done; audio chunks still to decode
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def is_done(self) -> bool:
        return self in (RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.FAILED)


class OutKind(enum.IntEnum):
    """What a sampled decode row means; set inside the stages so schedulers never read token ids."""

    AUDIO = 0
    STOP = 1
    OTHER = 2


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # <= 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repetition_window: int = 64
    max_tokens: int = 2048
    ignore_eos: bool = False
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError naming the field for a value outside its range."""
        checks = (
            ("temperature", 0.0 <= self.temperature <= 10.0, "must be in [0, 10]"),
            ("top_k", self.top_k >= 0, "must be >= 0 (0 disables)"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]"),
            ("min_p", 0.0 <= self.min_p < 1.0, "must be in [0, 1)"),
            ("repetition_penalty", 0.0 < self.repetition_penalty <= 10.0, "must be in (0, 10]"),
            ("repetition_window", 0 <= self.repetition_window <= 4096, "must be in [0, 4096]"),
            ("max_tokens", self.max_tokens >= 1, "must be >= 1"),
            ("seed", 0 <= self.seed < 2**63, "must be in [0, 2**63)"),
        )
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"{name} {why}")


@dataclass
class RequestStats:
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    first_audio: float | None = None
    finished: float | None = None
    num_audio_samples: int = 0  # audio sent to the client so far
    last_chunk_samples: int = 0  # of the most recent chunk: where the client's playback of it starts
    last_decode: float | None = None  # when the request last had a token row in a step (starvation guard)


@dataclass(frozen=True)
class EmbeddedPrompt:
    """A prompt whose positions carry vectors besides their ids (what `preprocess` returns for a voice clone)."""

    ids: list[list[int]]  # [prompt_len][input_columns]
    embeds: dict[int, list[float]]  # prompt position -> vector added to that position's input embedding


@dataclass
class TextFeed:
    """Text ids that arrive while an input-streaming request generates: the input of generated token
    row k (a frame, for Qwen3-TTS) carries `ids[k]`. `ids` only grows (it ends with the model's
    end-of-text id once `ended`), so the id fed to a row never changes, even when its KV is
    recomputed after a preemption."""

    ids: list[int] = field(default_factory=list)
    ended: bool = False

    def has(self, row: int) -> bool:
        """Whether generated row `row` may be fed: its text id arrived, or the text has ended (then rows
        past the ids carry no text)."""
        return row < len(self.ids) or self.ended


AudioSink = Callable[["Request", bytes | None, bool], None]
"""Called with (request, pcm16 bytes or None, is_final) for every chunk and once at the end."""


@dataclass(eq=False)  # one object per request: identity is equality (and list lookups stay O(1) per item)
class Request:
    """Everything the scheduler knows about one request.

    `tokens` are the generated token rows (one list of `codes_per_step` ids per decode step); `codes`
    is the flat list of audio codes, `codes_per_frame` of them per frame.
    """

    req_id: str
    prompt_ids: list[list[int]]  # [prompt_len][input_columns]
    sampling: SamplingParams
    # prompt position -> a vector added to its input embedding (meta.prompt_embed_dim wide)
    prompt_embeds: dict[int, list[float]] = field(default_factory=dict)
    streaming: bool = True
    sink: AudioSink | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0  # prompt + generated tokens whose KV is written
    tokens: list[list[int]] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    next_chunk: int = 0  # index of the next audio chunk to decode
    num_pending: int = 0  # tokens sampled by a step still in flight (asynchronous scheduling)
    finish_reason: str | None = None
    error: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    text_feed: TextFeed | None = None  # incremental input streaming only

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_generated(self) -> int:
        return len(self.tokens)

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.num_generated

    def input_row(self, pos: int) -> list[int]:
        """The input ids at absolute position `pos` (prompt, then generated tokens)."""
        if pos < self.prompt_len:
            return self.prompt_ids[pos]
        return self.tokens[pos - self.prompt_len]

    def history(self, window: int) -> list[int]:
        """The last `window` generated ids of the first codebook (repetition-penalty window)."""
        if window <= 0:
            return []
        return [row[0] for row in self.tokens[-window:]]

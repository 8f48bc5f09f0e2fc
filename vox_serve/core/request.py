"""Per-request state: one Request object with one status enum (torch-free).

What a request needs on every step lives on the device, in tables indexed by its request slot
(`vox_serve.core.slot_table` mirrors the counters the host decides on); the Request holds what the
host needs besides: its prompt, status, statistics, sink and streamed text. Its generated tokens
and audio codes stay on the device; `tokens` / `codes` are filled only when an engine loop records
outputs (tests and debugging).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from vox_serve.core.slot_table import SlotTable


class RequestStatus(enum.Enum):
    PREPARING = "preparing"  # its prompt is being built (tokenizer, reference-audio encoders)
    WAITING = "waiting"  # queued, no KV pages (never admitted, or preempted)
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
    STOP = 1  # the request stops; the row is not audio
    OTHER = 2
    AUDIO_STOP = 3  # the row is audio (its codes are kept) and the request stops after it

    @property
    def is_audio(self) -> bool:
        return self in (OutKind.AUDIO, OutKind.AUDIO_STOP)

    @property
    def stops(self) -> bool:
        return self in (OutKind.STOP, OutKind.AUDIO_STOP)


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


@dataclass(frozen=True)
class Prompt:
    """What a prompt builder returns: the prompt's input ids, and what else the program declared.

    `ids` [prompt_len, input_columns]; `vectors`: prompt position -> a vector added to that position's
    input embedding (any number, `ProgramLayout.prompt_vector_dim` wide); `conditioning`: per-slot
    fields the program declared (`ProgramLayout.slot_fields`), set once when the request is admitted, and
    its codec prefix (`meta.CODEC_PREFIX`, programs that declare `codec_prefix_frames`); `trailing_text`:
    for a model with a `streamed_text_column`, the text ids of the first generated rows (row k carries
    `trailing_text[k]`), ahead of any that stream in later.
    """

    ids: np.ndarray
    vectors: dict[int, np.ndarray] = field(default_factory=dict)
    conditioning: dict[str, np.ndarray] = field(default_factory=dict)
    trailing_text: tuple[int, ...] = ()

    @classmethod
    def of(cls, ids: Any, vectors: dict[int, Any] | None = None, conditioning: dict[str, Any] | None = None,
           trailing_text: Any = ()) -> Prompt:
        """A prompt from lists or arrays: ids as int32 [prompt_len, columns], vectors as float32, conditioning
        as int64 (integer values: codes) or float32."""
        rows = np.asarray(ids, dtype=np.int32)
        if rows.ndim != 2 or rows.shape[0] == 0:
            raise ValueError("a prompt needs at least one position of input ids")
        vecs = {int(p): np.asarray(v, dtype=np.float32) for p, v in (vectors or {}).items()}
        for p in vecs:
            if not 0 <= p < rows.shape[0]:
                raise ValueError(f"a prompt vector at position {p} lies outside the {rows.shape[0]} positions")
        conds = {k: _field_array(v) for k, v in (conditioning or {}).items()}
        return cls(rows, vecs, conds, tuple(int(t) for t in trailing_text))


def _field_array(value: Any) -> np.ndarray:
    array = np.asarray(value)
    return array.astype(np.int64 if array.dtype.kind in "iub" else np.float32)


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

    @property
    def limit(self) -> int:
        """Generated rows that may be fed now (a large number once the text has ended)."""
        return 1 << 40 if self.ended else len(self.ids)


AudioSink = Callable[["Request", bytes | memoryview | None, bool], None]
"""Called with (request, pcm16 bytes or None, is_final) for every chunk and once at the end. A chunk may be a
read-only memoryview (of one copy of its step's audio): a sink that keeps it keeps that copy alive."""


@dataclass
class Counters:
    """The host's counters of a request that holds no slot (before admission, after its end)."""

    num_computed: int = 0
    num_generated: int = 0
    num_pending: int = 0
    num_codes: int = 0
    next_chunk: int = 0


@dataclass(eq=False)  # one object per request: identity is equality (and list lookups stay O(1) per item)
class Request:
    """Everything the host knows about one request.

    Counters (`num_generated`, `num_codes`, ...) live in the scheduler's slot table while the request
    holds a slot (from its admission to its end, preemptions included) and in `Counters` otherwise.
    """

    req_id: str
    prompt: Prompt
    sampling: SamplingParams
    streaming: bool = True
    sink: AudioSink | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    status: RequestStatus = RequestStatus.WAITING
    slot: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    text_feed: TextFeed | None = None  # incremental input streaming only
    table: SlotTable | None = None  # set while the request holds a slot
    counters: Counters = field(default_factory=Counters)
    tokens: list[list[int]] = field(default_factory=list)  # recorded outputs only (EngineLoop(record=True))
    codes: list[int] = field(default_factory=list)

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.ids.shape[0])

    def _get(self, name: str) -> int:
        if self.table is not None and self.slot is not None:
            return int(getattr(self.table, name)[self.slot])
        return getattr(self.counters, name)

    @property
    def num_computed(self) -> int:
        """Positions whose KV is written or planned (prompt and generated tokens)."""
        return self._get("num_computed")

    @property
    def num_generated(self) -> int:
        return self._get("num_generated")

    @property
    def num_pending(self) -> int:
        """Tokens sampled by a step still in flight (asynchronous scheduling)."""
        return self._get("num_pending")

    @property
    def num_codes(self) -> int:
        return self._get("num_codes")

    @property
    def next_chunk(self) -> int:
        return self._get("next_chunk")

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.num_generated

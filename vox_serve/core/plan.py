"""The plain data the scheduler and the engine exchange: a step plan in, a step result out (torch-free).

A plan names rows by request slot: the engine keeps each request's state on the device (page
table, sampling parameters, token history, audio codes, codec state), so a row is a few scalars.
Columns are numpy arrays, one entry per row (or per token), so a plan of hundreds of rows is built
and consumed without a Python loop over rows. `docs/engine-contract.md` states every field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

ABSENT_ID = -1  # an input id the host does not give: generated positions take it from the slot's history
NO_SLOT = -1  # the slot of a padded row: the engine maps it to its scratch slot, no request's state
NULL_PAGE = 0  # the KV page padded rows write into; never handed out


def _i32(values: object) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


_NONE_I32, _NONE_BOOL = _i32([]), np.zeros(0, dtype=np.bool_)  # shared by empty launches (no entries to change)


_SHARED: dict[object, np.ndarray] = {}


def _shared(key: object, n: int, make: Callable[[int], np.ndarray]) -> np.ndarray:
    """The first n rows of make(size), read-only and shared: one array per key, grown by doubling."""
    kept = _SHARED.get(key)
    if kept is None or len(kept) < n:
        kept = make(max(n, 2 * (0 if kept is None else len(kept)), 64))
        kept.flags.writeable = False
        _SHARED[key] = kept
    return kept[:n]


def ones(n: int, dtype: type = np.int32) -> np.ndarray:
    """n ones, read-only and shared (a decode launch's token counts and sample flags, its plan's query lengths)."""
    return _shared(("ones", dtype), n, lambda size: np.ones(size, dtype=dtype))


def arange(n: int) -> np.ndarray:
    """0 .. n-1 (int64), read-only and shared (the rows of a launch that takes every row of the plan in order)."""
    return _shared("arange", n, np.arange)


def absent_ids(n: int, columns: int) -> np.ndarray:
    """[n, columns] of ABSENT_ID (int32), read-only and shared: the input ids of decode rows."""
    return _shared(("absent", columns), n, lambda size: np.full((size, columns), ABSENT_ID, dtype=np.int32))


@dataclass
class SlotInit:
    """A request admitted into a slot this step: the slot's device state is (re)set before any launch."""

    slot: int
    prompt_len: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    repetition_window: int
    seed: int
    allow_stop: bool  # False while ignore_eos holds
    conditioning: dict[str, np.ndarray] = field(default_factory=dict)  # the program's declared slot fields


@dataclass
class PageUpdates:
    """Page-table entries written this step: `page_table[slot[i], index[i]] = page[i]`."""

    slot: np.ndarray
    index: np.ndarray
    page: np.ndarray

    @classmethod
    def empty(cls) -> PageUpdates:
        return cls(_NONE_I32, _NONE_I32, _NONE_I32)

    def __len__(self) -> int:
        return len(self.slot)


@dataclass(frozen=True)
class LmRow:
    """One row of an LM launch, for reading a plan (tests, traces); launches are built and consumed as
    columns."""

    req_id: str
    slot: int
    start: int
    num_tokens: int
    sample: bool

    @property
    def kv_len(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True)
class CodecRow:
    """One row of a codec launch, for reading a plan."""

    req_id: str
    slot: int
    chunk_index: int
    first_frame: int
    window_end: int
    num_frames: int
    is_last: bool


_EMPTY_LM: dict[int, tuple[np.ndarray, ...]] = {}  # input columns -> an empty launch's arrays


@dataclass
class LmLaunch:
    """The sequences of one prefill or decode launch.

    Row i covers positions `start[i] .. start[i] + num_tokens[i] - 1` of the request in `slot[i]`;
    its tokens are rows `token_offset(i) ..` of `input_ids` [num_tokens.sum(), input_columns], which
    hold the ids the host knows (prompt positions, a streamed text column) and `ABSENT_ID` where a
    generated position takes its id from the slot's token history on the device. `sample[i]`: the
    row's last position samples the request's next token (False for a non-final chunk of a chunked
    prefill). `vector_token` / `vectors`: prompt vectors added to those tokens' input embeddings.
    """

    req_ids: Sequence[str]  # a list, or the slot table's object array of the rows' ids (decode launches)
    slot: np.ndarray
    start: np.ndarray
    num_tokens: np.ndarray
    sample: np.ndarray
    input_ids: np.ndarray
    vector_token: np.ndarray = field(default_factory=lambda: _i32([]))
    vectors: np.ndarray | None = None  # [len(vector_token), prompt_vector_dim] float32

    def __len__(self) -> int:
        return len(self.req_ids)

    def __iter__(self):  # noqa: ANN204 - rows for reading
        for i, req_id in enumerate(self.req_ids):
            yield LmRow(req_id, int(self.slot[i]), int(self.start[i]), int(self.num_tokens[i]), bool(self.sample[i]))

    @classmethod
    def empty(cls, columns: int) -> LmLaunch:
        """No rows (its arrays, which have no entries, are shared)."""
        arrays = _EMPTY_LM.get(columns)
        if arrays is None:
            z = _NONE_I32
            arrays = _EMPTY_LM[columns] = (z, z, z, _NONE_BOOL, np.zeros((0, columns), dtype=np.int32))
        return cls([], *arrays)

    @property
    def kv_len(self) -> np.ndarray:
        """KV length of each row after the launch."""
        return self.start + self.num_tokens

    @property
    def total_tokens(self) -> int:
        return int(self.num_tokens.sum())


@dataclass
class CodecLaunch:
    """Audio chunks to decode: row i turns frames `first_frame[i] .. window_end[i] - 1` of the request in
    `slot[i]` into PCM (lookback and lookahead included; frames before 0 repeat frame 0, the window past
    `window_end` repeats its last frame) and emits `num_frames[i]` frames' samples after the lookback."""

    req_ids: list[str]
    slot: np.ndarray
    chunk_index: np.ndarray
    first_frame: np.ndarray
    window_end: np.ndarray
    num_frames: np.ndarray
    is_last: np.ndarray

    def __len__(self) -> int:
        return len(self.req_ids)

    def __iter__(self):  # noqa: ANN204 - rows for reading
        for i, req_id in enumerate(self.req_ids):
            yield CodecRow(req_id, int(self.slot[i]), int(self.chunk_index[i]), int(self.first_frame[i]),
                           int(self.window_end[i]), int(self.num_frames[i]), bool(self.is_last[i]))

    @classmethod
    def empty(cls) -> CodecLaunch:
        """No rows (its arrays, which have no entries, are shared)."""
        return cls([], _NONE_I32, _NONE_I32, _NONE_I32, _NONE_I32, _NONE_I32, _NONE_BOOL)

    def take(self, rows: np.ndarray) -> CodecLaunch:
        """The rows selected by an index or mask array, in order."""
        index = np.flatnonzero(rows) if rows.dtype == np.bool_ else rows
        return CodecLaunch([self.req_ids[i] for i in index], self.slot[index], self.chunk_index[index],
                           self.first_frame[index], self.window_end[index], self.num_frames[index],
                           self.is_last[index])


@dataclass
class StepPlan:
    step_id: int
    admits: list[SlotInit] = field(default_factory=list)
    pages: PageUpdates = field(default_factory=PageUpdates.empty)
    codec: CodecLaunch = field(default_factory=CodecLaunch.empty)
    prefill: LmLaunch = field(default_factory=lambda: LmLaunch.empty(1))
    decode: LmLaunch = field(default_factory=lambda: LmLaunch.empty(1))

    @property
    def is_empty(self) -> bool:
        return not (self.prefill or self.decode or self.codec or self.admits or len(self.pages))

    @property
    def num_lm_rows(self) -> int:
        return len(self.prefill) + len(self.decode)


@dataclass
class StepResult:
    """What the host receives: an `OutKind` per LM row (aligned with the plan's rows; a non-sampling row's
    entry is meaningless) and the PCM of every codec row (int16 little-endian mono, `num_frames` frames)."""

    step_id: int
    prefill_kind: np.ndarray = field(default_factory=lambda: _i32([]))
    decode_kind: np.ndarray = field(default_factory=lambda: _i32([]))
    pcm: list[bytes | memoryview] = field(default_factory=list)  # a runtime may hand out views of one copy
    stage_seconds: dict[str, float] = field(default_factory=dict)
    pcm_early: bool = False  # the PCM was handed over before the step was collected (`early_pcm`); `pcm` is empty

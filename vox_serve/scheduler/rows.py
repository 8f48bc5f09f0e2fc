"""Building a plan's launches from requests: the few scalars per row that the engine needs.

The engine holds each admitted request's state on the device (page table, sampling parameters,
token history, codes), so an LM row is (slot, first position, token count, sample flag) plus the
input ids the host knows: prompt positions and a streamed text column. Generated positions carry
`ABSENT_ID` in their code columns; the stage takes them from the slot's history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vox_serve.core.meta import ProgramMeta
from vox_serve.core.plan import ABSENT_ID, CodecLaunch, LmLaunch, SlotInit, absent_ids, ones
from vox_serve.core.request import Request
from vox_serve.core.slot_table import NEVER, SlotTable
from vox_serve.scheduler.text_input import text_ids


def slot_init(req: Request) -> SlotInit:
    s = req.sampling
    return SlotInit(slot=req.slot, prompt_len=req.prompt_len, temperature=s.temperature, top_k=s.top_k,
                    top_p=s.top_p, min_p=s.min_p, repetition_penalty=s.repetition_penalty,
                    repetition_window=s.repetition_window,
                    seed=s.seed, allow_stop=not s.ignore_eos, conditioning=dict(req.prompt.conditioning))


@dataclass
class PrefillRows:
    """Prefill rows collected one by one (a step admits a handful of requests)."""

    meta: ProgramMeta
    reqs: list[Request] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    samples: list[bool] = field(default_factory=list)
    ids: list[np.ndarray] = field(default_factory=list)
    vector_tokens: list[int] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)
    num_tokens: int = 0

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, req: Request, start: int, n: int, sample: bool) -> None:
        """Positions start .. start + n - 1 of req."""
        self.ids.append(input_ids(self.meta, req, start, n))
        for pos, vec in req.prompt.vectors.items():
            if start <= pos < start + n:
                self.vector_tokens.append(self.num_tokens + pos - start)
                self.vectors.append(vec.reshape(-1))  # paired rows: the streams' vectors side by side
        self.reqs.append(req)
        self.starts.append(start)
        self.counts.append(n)
        self.samples.append(sample)
        self.num_tokens += n

    def launch(self) -> LmLaunch:
        if not self.reqs:
            return LmLaunch.empty(self.meta.input_columns)
        dim = self.meta.layout.kv_streams * self.meta.layout.prompt_vector_dim
        vectors = np.stack(self.vectors) if self.vectors else np.zeros((0, dim), dtype=np.float32)
        return LmLaunch(req_ids=[r.req_id for r in self.reqs], slot=_i32([r.slot for r in self.reqs]),
                        start=_i32(self.starts), num_tokens=_i32(self.counts),
                        sample=np.asarray(self.samples, dtype=np.bool_), input_ids=np.concatenate(self.ids),
                        vector_token=_i32(self.vector_tokens), vectors=vectors)


def input_ids(meta: ProgramMeta, req: Request, start: int, n: int) -> np.ndarray:
    """[n, input_columns] the host's ids of positions start..: the prompt's rows, then ABSENT_ID rows
    for generated positions (with the streamed text id in its column)."""
    width = meta.input_columns
    out = np.full((n, width), ABSENT_ID, dtype=np.int32)
    prompt = req.prompt.ids
    end = min(start + n, prompt.shape[0])
    if end > start:
        out[: end - start, : prompt.shape[1]] = prompt[start:end]
    column = meta.streamed_text_column
    if column is not None and req.text_feed is not None and start + n > prompt.shape[0]:
        first = max(start, prompt.shape[0])
        out[first - start :, column] = text_ids(req, first - prompt.shape[0], start + n - first)
    return out


def decode_launch(meta: ProgramMeta, table: SlotTable, slots: np.ndarray, starts: np.ndarray) -> LmLaunch:
    """One token per row: the position `starts[i]` of each request (its last sampled token's)."""
    n = len(slots)
    ids = absent_ids(n, meta.input_columns)  # read-only: copied where a streamed text column is written
    column = meta.streamed_text_column
    streaming = table.text_limit[slots] < NEVER if column is not None and table.num_text_fed else None
    if streaming is not None and streaming.any():
        ids = ids.copy()
        streamed = streaming.nonzero()[0]
        for i, req in zip(streamed.tolist(), table.requests[slots[streamed]], strict=True):
            ids[i, column] = text_ids(req, int(starts[i]) - req.prompt_len, 1)[0]
    return LmLaunch(req_ids=table.req_ids[slots], slot=slots.astype(np.int32), start=starts.astype(np.int32),
                    num_tokens=ones(n), sample=ones(n, np.bool_), input_ids=ids)


@dataclass
class CodecRows:
    """Codec rows collected in batches of columns (a step's chunks, chosen per round of requests)."""

    req_ids: list[str] = field(default_factory=list)
    parts: list[tuple[np.ndarray, dict[str, np.ndarray]]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.req_ids)

    def add(self, table: SlotTable, slots: np.ndarray, columns: dict[str, np.ndarray]) -> list[str]:
        """Rows of `slots` (one per entry) with their columns; returns their request ids."""
        ids = table.req_ids[slots].tolist()
        self.req_ids += ids
        self.parts.append((slots, columns))
        return ids

    def launch(self) -> CodecLaunch:
        if not self.req_ids:
            return CodecLaunch.empty()
        slots, columns = self.parts[0] if len(self.parts) == 1 else self._joined()
        i32 = lambda name: columns[name].astype(np.int32)  # noqa: E731
        return CodecLaunch(req_ids=self.req_ids, slot=slots.astype(np.int32), chunk_index=i32("chunk_index"),
                           first_frame=i32("first_frame"), window_end=i32("window_end"),
                           num_frames=i32("num_frames"), is_last=np.asarray(columns["is_last"], dtype=np.bool_))

    def _joined(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The parts' slots and columns, each joined in part order."""
        names = self.parts[0][1].keys()
        return (np.concatenate([s for s, _ in self.parts]),
                {name: np.concatenate([c[name] for _, c in self.parts]) for name in names})


def _i32(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)

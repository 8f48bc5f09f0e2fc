"""The KV pages of the scheduled requests: what a plan adds to the page tables, and freeing (torch-free).

The scheduler's page half, over the page pool and the slot table's `capacity` column: `reserve` grows one
request to hold a KV length, `one_each` gives many slots their next page in one allocation, and the entries
they add (block b of slot s, a page per KV stream) are the plan's page-table updates (`updates`). An ended
request's pages go back to the pool once no step still on the device writes them (`free`, `free_landed`).
Which request gets a page, and whom to preempt when none is free, is the scheduler's policy
(scheduler/base.py); this only keeps the books.
"""

from __future__ import annotations

from collections.abc import Container

import numpy as np

from vox_serve.core.meta import EngineLimits
from vox_serve.core.page_pool import PagePool
from vox_serve.core.plan import PageUpdates
from vox_serve.core.request import Request
from vox_serve.core.slot_table import SlotTable


class KvPages:
    def __init__(self, pool: PagePool, table: SlotTable, limits: EngineLimits) -> None:
        self.pool, self.table, self.limits = pool, table, limits
        self._entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (slot, index, page) of the plan
        self._free_later: dict[str, int] = {}  # ended request -> the step in flight that still writes its pages

    def start(self) -> None:
        """A new plan: no page-table entries yet."""
        self._entries = []

    def updates(self) -> PageUpdates:
        """The page-table entries the plan added."""
        if not self._entries:
            return PageUpdates.empty()
        return PageUpdates(*(_joined(column).astype(np.int32) for column in zip(*self._entries, strict=True)))

    def reserve(self, req: Request, kv_len: int) -> bool:
        """Grow req's KV pages to hold kv_len tokens, recording the page-table entries for the engine."""
        if not self.pool.can_reserve(req.req_id, kv_len):
            return False
        have = self.pool.num_blocks(req.req_id)
        new = np.asarray(self.pool.reserve(req.req_id, kv_len)).reshape(-1, self.limits.kv_streams)
        slot = req.slot
        self._add(np.full(len(new), slot), np.arange(have, have + len(new)), new)
        self.table.capacity[slot] = (have + len(new)) * self.pool.page_size
        return True

    def one_each(self, slots: np.ndarray) -> None:
        """The next page (a page per KV stream) of each slot's request, all at once (there are enough free pages)."""
        if not len(slots):
            return
        t, ps = self.table, self.pool.page_size
        pages = np.asarray(self.pool.extend_each(t.req_ids[slots].tolist())).reshape(-1, self.limits.kv_streams)
        self._add(slots, t.capacity[slots] // ps, pages)
        t.capacity[slots] += ps

    def _add(self, slots: np.ndarray, blocks: np.ndarray, pages: np.ndarray) -> None:
        """Block b of slot s (pages [n, kv_streams]); stream j's page of block b goes to column
        j * max_pages_per_seq + b of the slot's row."""
        streams = self.limits.kv_streams
        if streams == 1:
            self._entries.append((slots, blocks, pages[:, 0]))
            return
        columns = blocks[:, None] + self.limits.max_pages_per_seq * np.arange(streams)
        self._entries.append((np.repeat(slots, streams), columns.reshape(-1), pages.reshape(-1)))

    def free(self, req: Request, writing_step: int | None) -> None:
        """Return req's pages to the pool, or once `writing_step` (a step still on the device that writes
        them) has landed."""
        if writing_step is None:
            self.pool.free(req.req_id)
        else:
            self._free_later[req.req_id] = writing_step

    @property
    def held_back(self) -> set[str]:
        """Ended requests whose pages wait for a step in flight."""
        return set(self._free_later)

    def free_landed(self, in_flight: Container[int]) -> None:
        """Free the pages held back for steps no longer in flight."""
        for req_id in [r for r, step in self._free_later.items() if step not in in_flight]:
            self.pool.free(req_id)
            del self._free_later[req_id]


def _joined(parts: tuple[np.ndarray, ...]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)

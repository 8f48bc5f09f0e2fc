"""The host's mirror of the request slots: one row of counters per slot, as numpy columns (torch-free).

A request holds a slot from its admission until it ends (preemptions included): the slot indexes
its state on the device (page-table row, sampling parameters, token history, audio codes, codec
streaming state). The host keeps here only what it decides on -- how many positions are computed,
tokens generated and in flight, codes produced, the next audio chunk and when it is ready -- as
arrays, so a step's bookkeeping for hundreds of rows is a few vectorised operations instead of a
Python loop over requests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np

from vox_serve.core.chunks import ChunkGeometry
from vox_serve.core.page_pool import SlotPool
from vox_serve.core.request import Counters, Request

NEVER = np.iinfo(np.int64).max // 4  # a frame count no chunk ever needs


class SlotState:
    """The codes of `SlotTable.state` (int8). Plain ints, not an IntEnum: numpy compares an array with an
    IntEnum member about 7x slower than with an int, and the scheduler does it a few dozen times a step.
    DRAINING follows RUNNING, so `state >= RUNNING` selects the slots whose requests still make audio."""

    FREE: Final = 0
    WAITING: Final = 1  # preempted: holds its slot (its tokens and codes are on the device), no pages
    RUNNING: Final = 2
    DRAINING: Final = 3


COUNTERS = ("num_computed", "num_generated", "num_pending", "num_codes", "next_chunk")


class SlotTable:
    """Columns indexed by slot; `requests[slot]` is the slot's request (None when free) and `req_ids[slot]`
    its id (object arrays, so a batch's requests are one fancy index)."""

    def __init__(self, num_slots: int, geometry: ChunkGeometry, max_model_len: int) -> None:
        self.num_slots, self.geometry, self.max_model_len = num_slots, geometry, max_model_len
        self.pool = SlotPool(num_slots)
        self.requests = np.full(num_slots, None, dtype=object)
        self.req_ids = np.full(num_slots, None, dtype=object)
        zeros = lambda: np.zeros(num_slots, dtype=np.int64)  # noqa: E731
        self.num_computed, self.num_generated, self.num_pending = zeros(), zeros(), zeros()
        self.num_codes, self.next_chunk = zeros(), zeros()
        self.prompt_len, self.text_limit = zeros(), zeros()
        self.gen_limit = zeros()  # tokens the request may generate: max_tokens, or fewer to stay within max_model_len
        self.capacity = zeros()  # tokens the slot's KV pages hold
        self.occupancy = zeros()  # a number unique to each admission into the slot (0: free)
        self.admit_rank = zeros()  # order of (re)admission: the base policy's decode order
        self.lm_step = zeros()  # the last step planned with an LM row of the slot's request
        self.codec_step = zeros()  # the last step planned with a chunk of it
        self.last_decode = np.zeros(num_slots, dtype=np.float64)  # when the slot last had an LM row
        self.arrival = np.zeros(num_slots, dtype=np.float64)  # when the slot's request arrived (codec order)
        self.state = np.zeros(num_slots, dtype=np.int8)  # written through set_state / acquire / release only
        self._changes = 0  # bumped by every state or admission-order change (slots_in's cache key)
        self._in_state: dict[int, tuple[int, np.ndarray]] = {}  # state (-1: making audio) -> (changes, slots)
        self._occupancies = 0
        self._ranks = 0
        self.num_text_fed = 0  # slots whose requests stream their text (text_limit < NEVER possible)

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def can_acquire(self) -> bool:
        return self.pool.can_acquire()

    def acquire(self, req: Request) -> int:
        """Give `req` a slot, its counters moved into the table."""
        slot = self.pool.acquire(req.req_id)
        self._occupancies += 1
        c = req.counters
        for name in COUNTERS:
            getattr(self, name)[slot] = getattr(c, name)
        self.prompt_len[slot] = req.prompt_len
        self.gen_limit[slot] = min(req.sampling.max_tokens, self.max_model_len - req.prompt_len)
        self.text_limit[slot] = NEVER if req.text_feed is None else req.text_feed.limit
        self.num_text_fed += req.text_feed is not None
        self.capacity[slot] = self.lm_step[slot] = self.codec_step[slot] = 0
        self.occupancy[slot] = self._occupancies
        self.arrival[slot] = req.stats.arrival or 0.0
        self.mark_admitted(slot)
        self.last_decode[slot] = np.nan
        self.requests[slot], self.req_ids[slot] = req, req.req_id
        req.slot, req.table = slot, self
        self.next_chunk[slot] = c.next_chunk
        return slot

    def release(self, req: Request) -> int | None:
        """Take `req`'s slot back; its counters move back into the request."""
        slot = req.slot
        if slot is None:
            return None
        req.counters = Counters(**{name: int(getattr(self, name)[slot]) for name in COUNTERS})
        self.num_text_fed -= req.text_feed is not None
        req.slot, req.table = None, None
        self.requests[slot] = self.req_ids[slot] = None
        self.occupancy[slot] = 0
        self.set_state(slot, SlotState.FREE)
        self.pool.release(req.req_id)
        return slot

    def mark_admitted(self, slot: int) -> None:
        """The slot's request joins the running requests (again, after a preemption)."""
        self._ranks += 1
        self.admit_rank[slot] = self._ranks
        self.set_state(slot, SlotState.RUNNING)

    @property
    def changes(self) -> int:
        """A count of state and admission-order changes: equal counts, the same slots in each state."""
        return self._changes

    def set_state(self, slot: int, state: int) -> None:
        self.state[slot] = state
        self._changes += 1

    def slots_in(self, state: int) -> np.ndarray:
        """Slots in `state`, in admission order (read-only)."""
        return self._kept(state, lambda: _ordered((self.state == state).nonzero()[0], self.admit_rank))

    def making_audio(self) -> np.ndarray:
        """Running and draining slots (DRAINING follows RUNNING), in their requests' arrival order (read-only)."""
        return self._kept(-1, lambda: _ordered((self.state >= SlotState.RUNNING).nonzero()[0], self.arrival))

    def _kept(self, key: int, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """compute()'s slots, made read-only and kept until a slot's state or admission order changes."""
        kept = self._in_state.get(key)
        if kept is None or kept[0] != self._changes:
            slots = compute()
            slots.flags.writeable = False
            kept = self._in_state[key] = (self._changes, slots)
        return kept[1]

    def num_frames(self, slots: np.ndarray) -> np.ndarray:
        return self.num_codes[slots] // self.geometry.codes_per_frame


def _ordered(slots: np.ndarray, key: np.ndarray) -> np.ndarray:
    """slots sorted by key[slot], ties in slot order."""
    return slots[np.argsort(key[slots], kind="stable")]

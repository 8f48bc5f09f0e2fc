"""The base scheduling policy and the request life cycle every policy shares (torch-free).

Each step: audio chunks that are ready are decoded (in arrival order; which are ready, and their codec
rows, is chunk_plan.py's arithmetic); new requests are admitted and prefilled first; every other running
request decodes one token. What each step's results do to its requests is results.py's half.
Slots: an admitted request holds a request slot until it ends; the slot indexes its state on the
device (page table, sampling parameters, token history, codes, codec state) and the host's counters
in the slot table (`core/slot_table.py`), so the decode batch and the step's results are handled
with array operations, and Python runs per request only on events (admission, a new KV page, a
stop, a ready chunk).
KV pages: admission reserves the prompt's pages; decoding extends a request page by page (a page per
KV stream, for programs with paired rows: `ProgramLayout.kv_streams`; the books are kv_pages.py's). When a
decode finds no free page, the most recently admitted request is preempted: its pages are freed,
it keeps its slot (its tokens and audio stay on the device), and it returns to the front of the
queue to recompute its KV when pages free up. Requests in the step being planned, or in a step
still on the device, are never preempted. Input-streaming requests of models that feed text per
frame wait while their text runs dry (text_input.py).

Policies (online.py, offline.py, deadline.py) subclass `Scheduler` and override these hooks:
`select_codec` (which chunks to decode), `admission_order` / `can_admit` / `defer_admissions`
(which waiting requests to prefill), `decode_order` (who gets the decode batch when it is
full) and `next_wakeup` (when a policy that is holding work back wants to run again).

Asynchronous scheduling (`async_scheduling`): `schedule()` may be called again before the previous
plan's `update()`. A request decoding in the step in flight then decodes again: its input is the
token that step samples, which the engine reads from the slot's history on the device. A request
that stops is retired when its stop arrives, and whatever was planned for it in the meantime is
discarded, so nothing is emitted past a stop. Its pages are freed only once no step in flight
writes them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from vox_serve.config import SchedulerConfig
from vox_serve.core.chunks import ChunkGeometry
from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.page_pool import PagePool
from vox_serve.core.plan import LmLaunch, StepPlan
from vox_serve.core.request import Request, RequestStatus
from vox_serve.core.slot_table import SlotState, SlotTable
from vox_serve.scheduler.chunk_plan import ChunkPlanner
from vox_serve.scheduler.kv_pages import KvPages
from vox_serve.scheduler.results import StepResults, codes_of_kinds
from vox_serve.scheduler.rows import PrefillRows, decode_launch, slot_init
from vox_serve.scheduler.text_input import extend, waits_for_text

_EMPTY = np.zeros(0, dtype=np.int64)


class QueueFull(RuntimeError):
    """Too many requests are waiting; the caller should retry later."""


@dataclass
class Flight:
    """A planned step whose results have not been applied: which slot occupancies its rows belong to."""

    prefill_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    prefill_occupancy: np.ndarray = field(default_factory=lambda: _EMPTY)
    prefill_sample: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    decode_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    decode_occupancy: np.ndarray = field(default_factory=lambda: _EMPTY)
    changes: int = -1  # the slot table's `changes` when the step was planned


class Scheduler(StepResults):
    name = "base"

    def __init__(self, meta: ProgramMeta, limits: EngineLimits, config: SchedulerConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.meta, self.limits, self.config, self.clock = meta, limits, config, clock
        self.pool = PagePool(limits.num_pages, limits.page_size, kv_streams=limits.kv_streams)
        self.geometry = ChunkGeometry.from_meta(meta, limits.frames_per_chunk, limits.first_chunk_frames)
        self.table = SlotTable(limits.slots, self.geometry, limits.max_model_len)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admitted (holding pages), generating tokens
        self.draining: list[Request] = []  # tokens done, audio left
        self.step_id = 0
        self.now = clock()
        self.reasons: dict[str, dict[str, str]] = {}  # stage -> req_id -> why (for traces)
        self.notes: list[str] = []  # step-level decisions (for traces)
        self.on_release: Callable[[Request], None] | None = None  # called before a request's slot is freed
        self._flights: dict[int, Flight] = {}
        self._planned = np.zeros(limits.slots, dtype=np.bool_)  # slots with an LM row in the plan being made
        self._running = _EMPTY  # running slots in admission order, at the start of the plan being made
        self._running_changes = 0  # the table's `changes` when _running was taken
        self._admits: list = []
        self.pages = KvPages(self.pool, self.table, limits)
        self.chunks = ChunkPlanner(self.table, self.geometry, meta.stateful_codec, limits.max_codec_batch)
        self._codes_of = codes_of_kinds(meta.codes_per_step)

    # ---- requests in and out -------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a request; raises ValueError (too long, duplicate id) or QueueFull."""
        if req.req_id in self.requests:
            raise ValueError(f"request id {req.req_id!r} is already in use")
        if req.prompt_len + 1 > self.limits.max_model_len:
            raise ValueError(f"prompt of {req.prompt_len} tokens exceeds max_model_len {self.limits.max_model_len}")
        if self.pool.pages_needed(req.req_id, req.prompt_len + 1) > self.pool.num_usable:
            raise ValueError(f"prompt of {req.prompt_len} tokens does not fit in the KV cache")
        if req.prompt.ids.shape[1] > self.meta.input_columns:
            raise ValueError(f"prompt rows have {req.prompt.ids.shape[1]} ids; "
                             f"the model takes {self.meta.input_columns}")
        layout = self.meta.layout
        width = layout.kv_streams * layout.prompt_vector_dim
        if any(v.size != width for v in req.prompt.vectors.values()):
            raise ValueError(f"prompt vectors must have {width} values ({layout.kv_streams} stream(s) of "
                             f"{layout.prompt_vector_dim})")
        if len(self.waiting) >= self.config.max_queued_requests:
            raise QueueFull(f"{len(self.waiting)} requests are already waiting")
        req.stats.arrival = self.clock()
        self.requests[req.req_id] = req
        self.waiting.append(req)

    def abort(self, req_id: str, reason: str = "aborted") -> bool:
        req = self.requests.get(req_id)
        if req is None:
            return False
        self._end(req, RequestStatus.ABORTED, reason)
        return True

    def append_text(self, req_id: str, ids: list[int], ended: bool = False) -> None:
        """More streamed text for an input-streaming request (see text_input.py)."""
        req = self.requests.get(req_id)
        if req is not None:
            extend(req, ids, ended)

    def _text_waiting(self, slots: np.ndarray, generated: np.ndarray | None = None) -> np.ndarray:
        """[len(slots)] bool: the slot's next LM row needs streamed text that has not arrived (`generated`:
        the slots' tokens generated and in flight, when the caller has them)."""
        t = self.table
        if generated is None:
            generated = t.num_generated[slots] + t.num_pending[slots]
        return generated - 1 >= t.text_limit[slots]

    @property
    def num_waiting_for_text(self) -> int:
        """Requests that cannot run until more of their text arrives."""
        state = self.table.state
        slots = ((state == SlotState.RUNNING) | (state == SlotState.WAITING)).nonzero()[0]
        return int(self._text_waiting(slots).sum())

    @property
    def num_generating(self) -> int:
        """Running requests that are not waiting for text (what admission counts against the batch)."""
        slots = (self.table.state == SlotState.RUNNING).nonzero()[0]
        return len(slots) - int(self._text_waiting(slots).sum())

    def pool_usage(self) -> dict[str, tuple[int, int]]:
        """(free, total) of the KV page pool and of the request slots."""
        return {"kv_pages": (self.pool.num_free, self.pool.num_usable),
                "slots": (self.table.num_free, self.table.num_slots)}

    def has_work(self) -> bool:
        return bool(self.requests)

    @property
    def num_active(self) -> int:
        return len(self.requests)

    @property
    def num_in_flight(self) -> int:
        """Planned steps whose results have not been applied yet (asynchronous scheduling: at most 1)."""
        return len(self._flights)

    def next_wakeup(self) -> float | None:
        """When a policy holding work back will plan it without any new event (None: never waits)."""
        return None

    # ---- planning ------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        self.step_id += 1
        self.now = self.clock()
        self.reasons = {"codec": {}, "prefill": {}, "decode": {}}
        self.notes = []
        self._planned[:] = False
        self._running = self.table.slots_in(SlotState.RUNNING)
        self._running_changes = self.table.changes
        self._admits = []
        self.pages.start()
        self.chunks.start()
        self.select_codec()
        codec = self.chunks.rows.launch()
        prefill = self.select_prefill().launch()
        decode = self.select_decode()
        plan = StepPlan(self.step_id, admits=self._admits, pages=self.pages.updates(), codec=codec, prefill=prefill,
                        decode=decode)
        self._record_flight(plan)
        return plan

    def _record_flight(self, plan: StepPlan) -> None:
        if plan.is_empty:
            return
        t = self.table
        prefill, decode = plan.prefill.slot, plan.decode.slot
        self._flights[plan.step_id] = Flight(prefill_slots=prefill, prefill_occupancy=t.occupancy[prefill],
                                             prefill_sample=plan.prefill.sample, decode_slots=decode,
                                             decode_occupancy=t.occupancy[decode], changes=t.changes)
        t.lm_step[prefill] = t.lm_step[decode] = plan.step_id
        t.codec_step[plan.codec.slot] = plan.step_id

    def _mark_row(self, req: Request, kv_len: int, sample: bool) -> None:
        """req has an LM row in the plan: its KV up to kv_len counts as computed, its sample as pending."""
        t, slot = self.table, req.slot
        t.num_computed[slot] = kv_len
        t.num_pending[slot] += int(sample)
        t.last_decode[slot] = self.now
        self._planned[slot] = True

    # ---- codec ---------------------------------------------------------------------------
    def _ready(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slots, chunks ready, final flags as `_ready_chunks`) of the running and draining requests with a
        ready chunk, in arrival order."""
        slots = self.table.making_audio()
        count, no_more = self._ready_chunks(slots)
        ready = count > 0
        return slots[ready], count[ready], no_more[ready]

    def ready_slots(self) -> np.ndarray:
        """Slots of running and draining requests with a ready chunk, in arrival order."""
        return self._ready()[0]

    def ready_requests(self) -> list[Request]:
        """Running and draining requests with a ready chunk, in arrival order."""
        return list(self.table.requests[self.ready_slots()])

    def select_codec(self) -> None:
        """Base: every ready chunk, requests in arrival order."""
        self._plan_chunks(*self._ready(), "ready", None)

    def take_chunks(self, reqs: Iterable[Request], why: str | Callable[[Request], str],
                    room: int | None = None) -> int:
        """Plan ready chunks of `reqs` in that order, at most `room` more (default: up to the codec batch
        limit); returns how many requests got chunks (see `take_slot_chunks`)."""
        reqs = list(reqs)
        slots = np.fromiter((r.slot for r in reqs), dtype=np.int64, count=len(reqs))
        return self.take_slot_chunks(slots, why, room)

    def take_slot_chunks(self, slots: np.ndarray, why: str | Callable[[Request], str],
                         room: int | None = None) -> int:
        """Plan ready chunks of the requests in `slots`, in that order, at most `room` more; returns how
        many requests got chunks.

        A stateless codec may decode several chunks of one request in one batch (in order); a
        stateful one gets at most one per request, since each chunk advances the request's state.
        """
        return self._plan_chunks(slots, *self._ready_chunks(slots), why, room)

    def _plan_chunks(self, slots: np.ndarray, count: np.ndarray, no_more: np.ndarray,
                     why: str | Callable[[Request], str], room: int | None) -> int:
        """take_slot_chunks with the slots' ready chunks (`_ready_chunks`) known."""
        taken, ids = self.chunks.take(slots, count, no_more, room, bool(self.draining))
        reasons = self.reasons["codec"]
        if isinstance(why, str):
            reasons.update(dict.fromkeys(ids, why))  # a request's rows share its id
        elif len(taken):
            reasons.update((req.req_id, why(req)) for req in self.table.requests[taken])
        return len(taken)

    def _ready_chunks(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(chunks ready now, whether the last of them is a draining request's final one) per slot."""
        return self.chunks.ready_chunks(slots, bool(self.draining))

    @property
    def num_planned_chunks(self) -> int:
        return len(self.chunks.rows)

    def has_ready_chunk(self, req: Request) -> bool:
        return req.slot is not None and bool(self._ready_chunks(np.asarray([req.slot]))[0][0] > 0)

    # ---- prefill and admission -----------------------------------------------------------
    def select_prefill(self) -> PrefillRows:
        rows = PrefillRows(self.meta)
        budget = self.limits.max_prefill_tokens
        for req in self._continuing_prefills():
            if len(rows) >= self.limits.max_prefill_seqs or budget <= 0:
                return rows
            if self._prefill_row(req, budget, rows):
                budget = self.limits.max_prefill_tokens - rows.num_tokens
                self.reasons["prefill"][req.req_id] = "continue"
        if not self.waiting or self.defer_admissions():
            return rows
        for req in self.admission_order():
            if waits_for_text(req):
                continue  # preempted while its text ran dry: readmitted once the text arrives
            if len(rows) >= self.limits.max_prefill_seqs or budget <= 0 or not self.can_admit(req):
                break
            if not self._admit(req, budget, rows):
                break  # not enough pages or slots: wait for running requests to free some
            budget = self.limits.max_prefill_tokens - rows.num_tokens
            self.reasons["prefill"][req.req_id] = self.admission_reason(req)
        return rows

    def _continuing_prefills(self) -> list[Request]:
        """Running requests with more than one position to compute (a chunked prompt), or with prompt
        positions left (the host's ids and prompt vectors go in prefill rows only), admission order."""
        t = self.table
        slots = self._running
        prompt, computed = t.prompt_len[slots], t.num_computed[slots]
        todo = prompt + t.num_generated[slots] + t.num_pending[slots] - computed
        slots = slots[(todo > 1) | (computed < prompt)]
        if len(slots) and t.num_text_fed:
            slots = slots[~self._text_waiting(slots)]
        return list(t.requests[slots]) if len(slots) else []

    def _admit(self, req: Request, budget: int, rows: PrefillRows) -> bool:
        fresh = req.slot is None
        if fresh:
            if not self.table.can_acquire():
                self.notes.append(f"{req.req_id} waits for a free request slot")
                return False
            self.table.acquire(req)
        if not self._prefill_row(req, budget, rows):
            if fresh:
                self.table.release(req)
            return False
        if fresh:
            self._admits.append(slot_init(req))
        else:
            self.table.mark_admitted(req.slot)
        self.waiting.remove(req)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        return True

    def admission_order(self) -> list[Request]:
        """Base: first come, first served (preempted requests are back at the front)."""
        return list(self.waiting)

    def can_admit(self, req: Request) -> bool:
        """Base: as many generating requests as the decode batch holds (requests waiting for streamed
        text hold their pages and slot, but not a place in the batch)."""
        return self.num_generating < self.limits.max_batch

    def admission_reason(self, req: Request) -> str:
        return "new" if req.num_generated == 0 else "readmit after preemption"

    def defer_admissions(self) -> bool:
        """True to admit no new request this step (base: never)."""
        return False

    def _todo(self, req: Request) -> int:
        """Positions whose KV is not written yet, counting tokens sampled in flight."""
        return req.total_len + req.num_pending - req.num_computed

    def _prefill_row(self, req: Request, budget: int, rows: PrefillRows) -> bool:
        todo = self._todo(req)
        n = min(todo, budget)
        if n < todo and budget < self.limits.max_prefill_tokens:
            return False  # chunk long prompts only when they have the step's whole budget
        start = req.num_computed
        if not self.pages.reserve(req, start + n):
            return False
        rows.add(req, start, n, sample=n == todo)
        self._mark_row(req, start + n, sample=n == todo)
        return True

    # ---- decode --------------------------------------------------------------------------
    def decode_candidates(self) -> np.ndarray:
        """Slots of running requests with one token to decode and room for it, admission order."""
        t = self.table
        slots = self._running
        if t.changes != self._running_changes:  # some slot changed state while this plan was made
            slots = slots[t.state[slots] == SlotState.RUNNING]
        generated = t.num_generated[slots] + t.num_pending[slots]
        prompt, computed = t.prompt_len[slots], t.num_computed[slots]
        ok = ((prompt + generated - computed == 1) & (computed >= prompt) & (generated < t.gen_limit[slots])
              & ~self._planned[slots])
        if t.num_text_fed:
            ok &= ~self._text_waiting(slots, generated)
        return slots[ok]

    def select_decode(self) -> LmLaunch:
        candidates = self.decode_candidates()
        if type(self).decode_order is not Scheduler.decode_order:
            order = self.decode_order(list(self.table.requests[candidates]))
            candidates = np.asarray([r.slot for r in order], dtype=np.int64)
        slots = self._with_pages(candidates)
        t = self.table
        starts = t.num_computed[slots]  # a copy (fancy indexing)
        t.num_computed[slots] = starts + 1
        t.num_pending[slots] += 1
        t.last_decode[slots] = self.now  # (_with_pages marked the rows planned)
        return decode_launch(self.meta, t, slots, starts)

    def decode_order(self, candidates: list[Request]) -> list[Request]:
        """Who decodes first when the batch is full (base: admission order)."""
        return candidates

    def _with_pages(self, candidates: np.ndarray) -> np.ndarray:
        """The first max_batch candidates that have (or get) a KV page for their next token.

        Rows needing a page reserve it in order; when none is free the newest running request not
        protected (rows planned before it, steps in flight) is preempted, which may be the row itself
        or a later candidate.
        """
        t, chosen = self.table, []
        room, rest = self.limits.max_batch, candidates
        while room > 0 and len(rest):
            block, rest = rest[:room], rest[room:]
            needs = (t.num_computed[block] + 1 > t.capacity[block]).nonzero()[0]
            self._planned[block] = True  # protected from preemption, unless a page is found missing below
            if len(needs) * self.limits.kv_streams <= self.pool.num_free:  # no preemption: one allocation for all
                self.pages.one_each(block[needs])
                chosen.append(block)  # every row keeps its place (all running, none preempted)
                room -= len(block)
                continue
            for i in needs:
                self._planned[block[i]] = False
                self._planned[block[i]] = self._page_for(t.requests[block[i]], block[i + 1:])
            ok = self._planned[block] & (t.state[block] == SlotState.RUNNING)
            self._planned[block] = ok
            block = block[ok]
            chosen.append(block)
            room -= len(block)
        return (chosen[0] if len(chosen) == 1 else np.concatenate(chosen)) if chosen else _EMPTY

    def _page_for(self, req: Request, later: np.ndarray) -> bool:
        """Reserve req's next page, preempting if needed; False when the row must wait a step. Rows
        after it in the block (`later`) are not protected yet."""
        t = self.table
        if t.state[req.slot] != SlotState.RUNNING:
            return False  # preempted for an earlier row
        while not self.pages.reserve(req, req.num_computed + 1):
            self._planned[later] = False
            victim = next((r for r in reversed(self.running)
                           if not self._planned[r.slot] and not self.lm_in_flight(r.slot)), None)
            self._planned[later] = True
            if victim is None:
                self.notes.append(f"{req.req_id} waits a step for a KV page")
                return False
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def lm_in_flight(self, slot: int) -> bool:
        """Whether a step still on the device has an LM row of the slot's request."""
        return int(self.table.lm_step[slot]) in self._flights

    def _preempt(self, req: Request) -> None:
        self.pool.free(req.req_id)
        t = self.table
        t.num_computed[req.slot] = 0
        t.capacity[req.slot] = 0
        t.set_state(req.slot, SlotState.WAITING)
        req.status = RequestStatus.WAITING
        self.running.remove(req)
        self.waiting.appendleft(req)
        self.notes.append(f"preempted {req.req_id}: out of KV pages")

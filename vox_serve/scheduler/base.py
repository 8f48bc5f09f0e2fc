"""The base scheduling policy and the request life cycle every policy shares (pure Python, no torch).

Each step: audio chunks that are ready are decoded (in arrival order); new requests are admitted
and prefilled first; every other running request decodes one token.
KV pages: admission reserves the prompt's pages; decoding extends a request page by page. When a
decode finds no free page, the most recently admitted request is preempted: its pages are freed,
it keeps its generated tokens and audio, and it returns to the front of the queue to recompute
its KV when pages free up. So running out of pages never fails a request; new requests wait.
Requests in the step being planned, or in the step still on the device, are never preempted.
Input-streaming requests of models that feed text per frame wait while their text runs dry
(text_input.py).

Policies (online.py, offline.py, deadline.py) subclass `Scheduler` and override these hooks:
`select_codec` (which chunks to decode), `admission_order` / `can_admit` / `defer_admissions`
(which waiting requests to prefill), `decode_order` (who gets the decode batch when it is
full) and `next_wakeup` (when a policy that is holding work back wants to run again).

Asynchronous scheduling (`async_scheduling`): `schedule()` may be called again before the previous
plan's `update()`. A request decoding in the step in flight then decodes again with a placeholder
input (`LmRow.pending_input`); a request that stops is retired when its stop arrives, and whatever
was planned for it in the meantime is discarded, so nothing is emitted past a stop. Its pages are
freed only once no step in flight writes them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

from vox_serve.config import SchedulerConfig
from vox_serve.core.chunks import ChunkGeometry
from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.page_pool import PagePool, SlotPool
from vox_serve.core.plan import ABSENT_ID, CodecRow, LmOut, LmRow, StepPlan, StepResult
from vox_serve.core.request import OutKind, Request, RequestStatus
from vox_serve.scheduler.text_input import add_text, extend, waits_for_text


class QueueFull(RuntimeError):
    """Too many requests are waiting; the caller should retry later."""


class Scheduler:
    name = "base"

    def __init__(self, meta: ProgramMeta, limits: EngineLimits, config: SchedulerConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.meta, self.limits, self.config, self.clock = meta, limits, config, clock
        self.pool = PagePool(limits.num_pages, limits.page_size)
        self.slots = SlotPool(limits.codec_slots) if meta.stateful_codec else None
        self.geometry = ChunkGeometry.from_meta(meta, limits.frames_per_chunk, limits.first_chunk_frames)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admitted (holding pages), generating tokens
        self.draining: list[Request] = []  # tokens done, audio left
        self.step_id = 0
        self.now = clock()
        self.reasons: dict[str, dict[str, str]] = {}  # stage -> req_id -> why (for traces)
        self.notes: list[str] = []  # step-level decisions (for traces)
        self._in_flight: dict[int, set[str]] = {}  # planned, not yet updated: step -> LM row req ids
        self._codec_in_flight: dict[int, set[str]] = {}  # step -> req ids with chunks in it
        self._free_later: set[str] = set()  # ended requests whose pages a step in flight still writes
        self._released_slots: list[int] = []

    # ---- requests in and out -------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a request; raises ValueError (too long, duplicate id) or QueueFull."""
        if req.req_id in self.requests:
            raise ValueError(f"request id {req.req_id!r} is already in use")
        if req.prompt_len + 1 > self.limits.max_model_len:
            raise ValueError(f"prompt of {req.prompt_len} tokens exceeds max_model_len {self.limits.max_model_len}")
        if self.pool.pages_needed(req.req_id, req.prompt_len + 1) > self.pool.num_usable:
            raise ValueError(f"prompt of {req.prompt_len} tokens does not fit in the KV cache")
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

    @property
    def num_waiting_for_text(self) -> int:
        """Requests that cannot run until more of their text arrives."""
        return sum(waits_for_text(r) for r in self.running + list(self.waiting))

    def pool_usage(self) -> dict[str, tuple[int, int]]:
        """(free, total) of the KV page pool and, for stateful codecs, the codec slot pool."""
        usage = {"kv_pages": (self.pool.num_free, self.pool.num_usable)}
        if self.slots is not None:
            usage["codec_slots"] = (self.slots.num_free, self.slots.num_slots)
        return usage

    def has_work(self) -> bool:
        return bool(self.requests)

    @property
    def num_active(self) -> int:
        return len(self.requests)

    @property
    def num_in_flight(self) -> int:
        """Planned steps whose results have not been applied yet (asynchronous scheduling: at most 1)."""
        return len(self._in_flight)

    def next_wakeup(self) -> float | None:
        """When a policy holding work back will plan it without any new event (None: never waits)."""
        return None

    # ---- planning ------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        self.step_id += 1
        self.now = self.clock()
        self.reasons = {"codec": {}, "prefill": {}, "decode": {}}
        self.notes = []
        plan = StepPlan(self.step_id)
        plan.codec = self.select_codec()
        plan.prefill = self.select_prefill()
        plan.decode = self.select_decode({r.req_id for r in plan.prefill})
        plan.released_slots, self._released_slots = self._released_slots, []
        self._mark_planned(plan)
        return plan

    def _mark_planned(self, plan: StepPlan) -> None:
        """The plan's rows will run: their KV counts as computed and their samples as pending."""
        for row in plan.prefill + plan.decode:
            req = self.requests[row.req_id]
            req.num_computed = row.kv_len
            req.stats.last_decode = self.now
            if row.sample:
                req.num_pending += 1
        if not plan.is_empty:
            self._in_flight[plan.step_id] = {r.req_id for r in plan.prefill + plan.decode}
            self._codec_in_flight[plan.step_id] = {r.req_id for r in plan.codec}

    # ---- codec ---------------------------------------------------------------------------
    def select_codec(self) -> list[CodecRow]:
        """Base: every ready chunk, requests in arrival order."""
        reqs = sorted(self.running + self.draining, key=lambda r: r.stats.arrival)
        return self.take_chunks(reqs, "ready")

    def take_chunks(self, reqs: Iterable[Request], why: str | Callable[[Request], str],
                    room: int | None = None) -> list[CodecRow]:
        """Ready chunks of `reqs` in that order, at most `room` (default: the codec batch limit).

        A stateless codec may decode several chunks of one request in one batch (in order); a
        stateful one gets at most one per request, since each chunk advances the request's state.
        """
        room = self.limits.max_codec_batch if room is None else room
        rows: list[CodecRow] = []
        for req in reqs:
            if len(rows) >= room:
                break
            took = self._chunk_rows(req, room - len(rows))
            if took:
                self.reasons["codec"][req.req_id] = why if isinstance(why, str) else why(req)
                rows.extend(took)
        return rows

    def has_ready_chunk(self, req: Request) -> bool:
        return self._window(req, req.next_chunk) is not None

    def _window(self, req: Request, index: int):  # noqa: ANN202
        num_frames = len(req.codes) // self.geometry.codes_per_frame
        return self.geometry.chunk(index, num_frames, final=req.status is RequestStatus.DRAINING)

    def _chunk_rows(self, req: Request, room: int) -> list[CodecRow]:
        slot = 0
        if self.slots is not None:
            room = min(room, 1)
            has_slot = self.slots.slot(req.req_id) is not None
            if not self.has_ready_chunk(req) or not (has_slot or self.slots.can_acquire()):
                return []
            slot = self.slots.acquire(req.req_id)
        rows: list[CodecRow] = []
        while len(rows) < room and (window := self._window(req, req.next_chunk)) is not None:
            req.next_chunk += 1
            is_last = req.status is RequestStatus.DRAINING and self._window(req, req.next_chunk) is None
            rows.append(CodecRow(req.req_id, window.chunk_index, self.geometry.frames_of(req.codes, window),
                                 window.num_frames, window.first_frame, req.sampling.seed, slot, is_last))
        return rows

    # ---- prefill and admission -----------------------------------------------------------
    def select_prefill(self) -> list[LmRow]:
        rows: list[LmRow] = []
        budget = self.limits.max_prefill_tokens
        for req in [r for r in self.running if self._todo(r) > 1 and not waits_for_text(r)]:
            if len(rows) >= self.limits.max_prefill_seqs or budget <= 0:
                return rows
            row = self._prefill_row(req, budget)
            if row is not None:
                rows.append(row)
                budget -= row.num_tokens
                self.reasons["prefill"][req.req_id] = "continue"
        if not self.waiting or self.defer_admissions():
            return rows
        for req in self.admission_order():
            if waits_for_text(req):
                continue  # preempted while its text ran dry: readmitted once the text arrives
            if len(rows) >= self.limits.max_prefill_seqs or budget <= 0 or not self.can_admit(req):
                break
            row = self._prefill_row(req, budget)
            if row is None:
                break  # not enough pages: wait for running requests to free some
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            rows.append(row)
            budget -= row.num_tokens
            self.reasons["prefill"][req.req_id] = self.admission_reason(req)
        return rows

    def admission_order(self) -> list[Request]:
        """Base: first come, first served (preempted requests are back at the front)."""
        return list(self.waiting)

    def can_admit(self, req: Request) -> bool:
        """Base: as many running requests as the decode batch holds."""
        return self.num_batch_places_taken < self.limits.max_batch

    @property
    def num_batch_places_taken(self) -> int:
        """Running requests that count against the decode batch: not those waiting for streamed text,
        which keep their pages and codec slot but leave their batch place to others (text_input.py)."""
        return sum(not waits_for_text(r) for r in self.running)

    def admission_reason(self, req: Request) -> str:
        return "new" if req.num_generated == 0 else "readmit after preemption"

    def defer_admissions(self) -> bool:
        """True to admit no new request this step (base: never)."""
        return False

    def _todo(self, req: Request) -> int:
        """Positions whose KV is not written yet, counting tokens sampled in flight."""
        return req.total_len + req.num_pending - req.num_computed

    def _prefill_row(self, req: Request, budget: int) -> LmRow | None:
        todo = self._todo(req)
        n = min(todo, budget)
        if n < todo and budget < self.limits.max_prefill_tokens:
            return None  # chunk long prompts only when they have the step's whole budget
        kv_len = req.num_computed + n
        if not self.pool.can_reserve(req.req_id, kv_len):
            return None
        self.pool.reserve(req.req_id, kv_len)
        return self._lm_row(req, n, sample=n == todo)

    # ---- decode --------------------------------------------------------------------------
    def select_decode(self, exclude: set[str]) -> list[LmRow]:
        rows: list[LmRow] = []
        planned = set(exclude)
        candidates = [r for r in self.running if r.req_id not in planned and self._decodable(r)]
        for req in self.decode_order(candidates):
            if len(rows) >= self.limits.max_batch:
                break
            if req not in self.running:
                continue  # preempted to make room for an earlier row
            if self._ensure_pages(req, planned):
                rows.append(self._lm_row(req, 1, sample=True))
                planned.add(req.req_id)
                self.reasons["decode"].setdefault(req.req_id, "running")
        return rows

    def decode_order(self, candidates: list[Request]) -> list[Request]:
        """Who decodes first when the batch is full (base: admission order)."""
        return candidates

    def _decodable(self, req: Request) -> bool:
        """One token to decode, and room for it (a token in flight may be the request's last)."""
        generated = req.num_generated + req.num_pending
        return (self._todo(req) == 1 and generated < req.sampling.max_tokens and not waits_for_text(req)
                and req.total_len + req.num_pending < self.limits.max_model_len)

    def _ensure_pages(self, req: Request, planned: set[str]) -> bool:
        """Reserve pages for req's next token, preempting the newest unprotected requests first.

        Requests already in this step's plan or in a step in flight are never preempted (those
        steps write their pages). Returns False when req itself was preempted or must wait.
        """
        kv_len = req.num_computed + 1
        while not self.pool.can_reserve(req.req_id, kv_len):
            protected = planned | self._flying_ids()
            victim = next((r for r in reversed(self.running) if r.req_id not in protected), None)
            if victim is None:
                self.notes.append(f"{req.req_id} waits a step for a KV page")
                return False
            self._preempt(victim)
            if victim is req:
                return False
        self.pool.reserve(req.req_id, kv_len)
        return True

    def _flying_ids(self) -> set[str]:
        return set().union(*self._in_flight.values()) if self._in_flight else set()

    def _preempt(self, req: Request) -> None:
        self.pool.free(req.req_id)
        req.num_computed = 0
        req.status = RequestStatus.WAITING
        self.running.remove(req)
        self.waiting.appendleft(req)
        self.notes.append(f"preempted {req.req_id}: out of KV pages")

    def _lm_row(self, req: Request, n: int, sample: bool) -> LmRow:
        s = req.sampling
        start = req.num_computed
        known = min(start + n, req.total_len)
        pending = start + n > req.total_len  # the last input is the token sampled in flight
        width = self.meta.input_columns
        input_ids = [_widen(req.input_row(p), width) for p in range(start, known)]
        if pending:
            input_ids.append([ABSENT_ID] * width)
        add_text(self.meta, req, start, input_ids)
        return LmRow(
            req_id=req.req_id, input_ids=input_ids,
            start_pos=start, pages=self.pool.pages(req.req_id), sample=sample,
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
            repetition_penalty=s.repetition_penalty,
            history=req.history(s.repetition_window) if s.repetition_penalty != 1.0 else [],  # 1.0: no effect
            gen_index=req.num_generated + req.num_pending, num_codes=len(req.codes),
            allow_stop=not s.ignore_eos, seed=s.seed, pending_input=pending,
            embeds=[(p - start, vec) for p, vec in req.prompt_embeds.items() if start <= p < known],
        )

    # ---- results -------------------------------------------------------------------------
    def update(self, plan: StepPlan, result: StepResult) -> None:
        now = self.clock()
        self._in_flight.pop(plan.step_id, None)
        self._codec_in_flight.pop(plan.step_id, None)
        for row in plan.prefill + plan.decode:
            req = self.requests.get(row.req_id)
            if req is not None and row.sample:
                req.num_pending -= 1
        for out in result.prefill + result.decode:
            req = self.requests.get(out.req_id)
            if req is not None and req.status is RequestStatus.RUNNING:
                self._on_token(req, out, now)
        for chunk in result.codec:
            req = self.requests.get(chunk.req_id)
            if req is not None:
                self._on_audio(req, chunk.pcm, now)
        decoding = set().union(*self._codec_in_flight.values())  # chunks still on the device
        for req in list(self.draining):
            if req.req_id not in decoding and self._next_codec_done(req):
                self._end(req, RequestStatus.FINISHED, req.finish_reason)
        self._free_landed_pages()

    def _on_audio(self, req: Request, pcm: bytes, now: float) -> None:
        if req.stats.first_audio is None:
            req.stats.first_audio = now
        samples = len(pcm) // 2
        req.stats.num_audio_samples += samples
        req.stats.last_chunk_samples = samples
        if req.sink is not None:
            req.sink(req, pcm, False)

    def _on_token(self, req: Request, out: LmOut, now: float) -> None:
        if req.stats.first_token is None:
            req.stats.first_token = now
        if out.kind == OutKind.STOP:
            self._finish_generation(req, "stop")
            return
        req.tokens.append(out.tokens)
        if out.kind == OutKind.AUDIO:
            req.codes.extend(out.codes)
        if req.num_generated >= req.sampling.max_tokens or req.total_len >= self.limits.max_model_len:
            self._finish_generation(req, "length")

    def _finish_generation(self, req: Request, reason: str) -> None:
        req.finish_reason = reason
        req.status = RequestStatus.DRAINING
        self._free_pages(req)
        self.running.remove(req)
        self.draining.append(req)

    def _next_codec_done(self, req: Request) -> bool:
        num_frames = len(req.codes) // self.geometry.codes_per_frame
        return self.geometry.chunk(req.next_chunk, num_frames, final=True) is None

    def fail(self, plan: StepPlan, error: str) -> None:
        """A step raised: fail exactly the requests it carried; the others go on."""
        self._in_flight.pop(plan.step_id, None)
        self._codec_in_flight.pop(plan.step_id, None)
        for row in plan.prefill + plan.decode + plan.codec:
            req = self.requests.get(row.req_id)
            if req is not None:
                self._end(req, RequestStatus.FAILED, "error", error)
        self._free_landed_pages()

    def _end(self, req: Request, status: RequestStatus, reason: str | None, error: str | None = None) -> None:
        self._free_pages(req)
        if self.slots is not None and (slot := self.slots.slot(req.req_id)) is not None:
            self.slots.release(req.req_id)
            self._released_slots.append(slot)
        for queue in (self.running, self.draining):
            if req in queue:
                queue.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.requests.pop(req.req_id, None)
        req.status, req.finish_reason, req.error = status, reason, error
        req.stats.finished = self.clock()
        if req.sink is not None:
            req.sink(req, None, True)

    def _free_pages(self, req: Request) -> None:
        if req.req_id in self._flying_ids():
            self._free_later.add(req.req_id)
        else:
            self.pool.free(req.req_id)

    def _free_landed_pages(self) -> None:
        if self._free_later:
            flying = self._flying_ids()
            for req_id in [r for r in self._free_later if r not in flying]:
                self.pool.free(req_id)
                self._free_later.discard(req_id)


def _widen(row: list[int], width: int) -> list[int]:
    """A generated row (codes_per_step ids) padded to the input width (models with a text column)."""
    return row if len(row) == width else row + [ABSENT_ID] * (width - len(row))

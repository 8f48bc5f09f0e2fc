"""The base scheduling policy and the request life cycle it drives (pure Python, no torch).

Each step: audio chunks that are ready are decoded (one per request, in arrival order); new
requests are admitted and prefilled first; every other running request decodes one token.
KV pages: admission reserves the prompt's pages; decoding extends a request page by page. When a
decode finds no free page, the most recently admitted request is preempted: its pages are freed,
it keeps its generated tokens and audio, and it returns to the front of the queue to recompute
its KV when pages free up. So running out of pages never fails a request; new requests wait.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from vox_serve.config import SchedulerConfig
from vox_serve.request import OutKind, Request, RequestStatus
from vox_serve.rt.meta import EngineLimits, ProgramMeta
from vox_serve.rt.page_pool import PagePool
from vox_serve.scheduler.chunks import ChunkGeometry
from vox_serve.scheduler.plan import CodecRow, LmOut, LmRow, StepPlan, StepResult


class QueueFull(RuntimeError):
    """Too many requests are waiting; the caller should retry later."""


class Scheduler:
    def __init__(self, meta: ProgramMeta, limits: EngineLimits, config: SchedulerConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.meta, self.limits, self.config, self.clock = meta, limits, config, clock
        self.pool = PagePool(limits.num_pages, limits.page_size)
        self.geometry = ChunkGeometry.from_meta(meta, limits.frames_per_chunk)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admitted (holding pages), generating tokens
        self.draining: list[Request] = []  # tokens done, audio left
        self.step_id = 0

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

    def has_work(self) -> bool:
        return bool(self.requests)

    @property
    def num_active(self) -> int:
        return len(self.requests)

    # ---- planning ------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        self.step_id += 1
        plan = StepPlan(self.step_id)
        plan.codec = self.select_codec()
        plan.prefill = self.select_prefill()
        prefilled = {r.req_id for r in plan.prefill}
        plan.decode = self.select_decode(prefilled)
        return plan

    def select_codec(self) -> list[CodecRow]:
        rows: list[CodecRow] = []
        for req in sorted(self.running + self.draining, key=lambda r: r.stats.arrival):
            if len(rows) >= self.limits.max_codec_batch:
                break
            row = self._next_codec_row(req)
            if row is not None:
                rows.append(row)
        return rows

    def _next_codec_row(self, req: Request) -> CodecRow | None:
        num_frames = len(req.codes) // self.geometry.codes_per_frame
        window = self.geometry.chunk(req.next_chunk, num_frames, final=req.status is RequestStatus.DRAINING)
        if window is None:
            return None
        req.next_chunk += 1
        return CodecRow(req.req_id, window.chunk_index, self.geometry.frames_of(req.codes, window),
                        window.num_frames, window.first_frame, req.sampling.seed)

    def select_prefill(self) -> list[LmRow]:
        rows: list[LmRow] = []
        budget = self.limits.max_prefill_tokens
        pending = [r for r in self.running if r.total_len - r.num_computed > 1]
        for req in pending:
            if len(rows) >= self.limits.max_prefill_seqs or budget <= 0:
                return rows
            row = self._prefill_row(req, budget)
            if row is not None:
                rows.append(row)
                budget -= row.num_tokens
        while self.waiting and len(rows) < self.limits.max_prefill_seqs and budget > 0:
            if len(self.running) >= self.limits.max_batch:
                break
            req = self.waiting[0]
            row = self._prefill_row(req, budget)
            if row is None:
                break  # not enough pages: wait for running requests to free some
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            rows.append(row)
            budget -= row.num_tokens
        return rows

    def _prefill_row(self, req: Request, budget: int) -> LmRow | None:
        todo = req.total_len - req.num_computed
        n = min(todo, budget)
        if n < todo and budget < self.limits.max_prefill_tokens:
            return None  # chunk long prompts only when they have the step's whole budget
        kv_len = req.num_computed + n
        if not self.pool.can_reserve(req.req_id, kv_len):
            return None
        self.pool.reserve(req.req_id, kv_len)
        return self._lm_row(req, n, sample=n == todo)

    def select_decode(self, exclude: set[str]) -> list[LmRow]:
        rows: list[LmRow] = []
        planned = set(exclude)
        for req in list(self.running):
            if req.req_id in planned or req.total_len - req.num_computed != 1 or req not in self.running:
                continue
            if self._ensure_pages(req, planned):
                rows.append(self._lm_row(req, 1, sample=True))
                planned.add(req.req_id)
        return rows

    def _ensure_pages(self, req: Request, planned: set[str]) -> bool:
        """Reserve pages for req's next token, preempting the newest unplanned requests first.

        Requests already in this step's plan are never preempted (the step writes their pages).
        Returns False when req itself had to be preempted.
        """
        while not self.pool.can_reserve(req.req_id, req.total_len):
            victim = next(r for r in reversed(self.running) if r.req_id not in planned)
            self._preempt(victim)
            if victim is req:
                return False
        self.pool.reserve(req.req_id, req.total_len)
        return True

    def _preempt(self, req: Request) -> None:
        self.pool.free(req.req_id)
        req.num_computed = 0
        req.status = RequestStatus.WAITING
        self.running.remove(req)
        self.waiting.appendleft(req)

    def _lm_row(self, req: Request, n: int, sample: bool) -> LmRow:
        s = req.sampling
        start = req.num_computed
        return LmRow(
            req_id=req.req_id, input_ids=[req.input_row(p) for p in range(start, start + n)],
            start_pos=start, pages=self.pool.pages(req.req_id), sample=sample,
            temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
            repetition_penalty=s.repetition_penalty, history=req.history(s.repetition_window),
            gen_index=req.num_generated, num_codes=len(req.codes), allow_stop=not s.ignore_eos, seed=s.seed,
        )

    # ---- results -------------------------------------------------------------------------
    def update(self, plan: StepPlan, result: StepResult) -> None:
        now = self.clock()
        for row in plan.prefill + plan.decode:
            req = self.requests.get(row.req_id)
            if req is not None and req.status is RequestStatus.RUNNING:
                req.num_computed = row.kv_len
        for out in result.prefill + result.decode:
            req = self.requests.get(out.req_id)
            if req is not None and req.status is RequestStatus.RUNNING:
                self._on_token(req, out, now)
        for chunk in result.codec:
            req = self.requests.get(chunk.req_id)
            if req is None:
                continue
            if req.stats.first_audio is None:
                req.stats.first_audio = now
            req.stats.num_audio_samples += len(chunk.pcm) // 2
            if req.sink is not None:
                req.sink(req, chunk.pcm, False)
        for req in list(self.draining):
            if self._next_codec_done(req):
                self._end(req, RequestStatus.FINISHED, req.finish_reason)

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
        self.pool.free(req.req_id)
        self.running.remove(req)
        self.draining.append(req)

    def _next_codec_done(self, req: Request) -> bool:
        num_frames = len(req.codes) // self.geometry.codes_per_frame
        return self.geometry.chunk(req.next_chunk, num_frames, final=True) is None

    def fail(self, plan: StepPlan, error: str) -> None:
        """A step raised: fail exactly the requests it carried; the others go on."""
        for row in plan.prefill + plan.decode + plan.codec:
            req = self.requests.get(row.req_id)
            if req is not None:
                self._end(req, RequestStatus.FAILED, "error", error)

    def _end(self, req: Request, status: RequestStatus, reason: str | None, error: str | None = None) -> None:
        self.pool.free(req.req_id)
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

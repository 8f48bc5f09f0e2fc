"""The `deadline` policy: earliest playback deadline first, for audio, tokens and admissions.

- A stream's deadline is when its client runs out of audio (first chunk: arrival +
  `deadline_startup_ms`). Ready chunks decode in deadline order, in steps where some chunk is due
  (a first chunk, a final chunk of a non-streaming request, or a stream within a second of its
  deadline); other ready chunks join while the batch has room.
- New requests are admitted in order of their first-audio deadline. Admissions are deferred, for
  at most `deadline_max_prefill_deferral_ms`, while a running stream is about to underrun: its
  slack (deadline minus the estimated time to its next chunk, from the step period and
  `deadline_codec_ms`) is shorter than a prefill (`deadline_prefill_ms`).
- A waiting stream stops being deferred early, before the limit, once waiting longer would make
  it miss its own first-audio deadline (its first-audio slack is shorter than a prefill): its
  deadline is then as close as those of the streams it waits for.
- Estimates of the time to a request's next chunk use the step period measured over recent steps
  (an average of the time between planned steps) once there is one, and `deadline_lm_step_ms`
  until then.
- More requests may be admitted than one decode batch holds, while no stream is about to underrun,
  the batch can keep them all real time (at the step period, each running stream gets a frame's
  tokens before its client has played a frame) and the KV cache keeps a page of headroom per
  running request; the batch then goes to the earliest deadlines, so streams that are far ahead
  of their clients make room for new ones.
- A stream waiting for its streamed text is never "about to underrun" for admissions: holding
  other requests back cannot help it.
- Non-streaming requests have no playback deadline: they never defer admissions, and they take
  the capacity streams leave. Any request that has not decoded for the maximum deferral decodes
  first, so nothing starves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from vox_serve.config import SchedulerConfig
from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.plan import StepPlan
from vox_serve.core.request import Request, RequestStatus
from vox_serve.scheduler.base import Scheduler
from vox_serve.scheduler.playback import PLAYBACK_MARGIN_S, playback_deadline
from vox_serve.scheduler.text_input import waits_for_text

PERIOD_SMOOTHING = 0.05
"""Weight of the newest step in the measured step period (an exponential average over ~20 steps)."""
PERIOD_WARMUP_STEPS = 8
"""Steps measured before the measured period replaces `deadline_lm_step_ms`."""
PERIOD_MAX_SAMPLE_FACTOR = 4.0
"""A gap between two planned steps longer than this many times the current estimate (and the
configured `deadline_lm_step_ms`) is a stall or an idle loop, not a step: it is not measured."""

NON_STREAMING_STARTUP_FACTOR = 10.0
"""A non-streaming request is admitted as if its first audio were due this many startup budgets
after its arrival: after the streams that arrived with it, but never behind them forever."""


class DeadlineScheduler(Scheduler):
    name = "deadline"

    def __init__(self, meta: ProgramMeta, limits: EngineLimits, config: SchedulerConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(meta, limits, config, clock)
        self.startup_s = config.deadline_startup_ms / 1000
        self.max_deferral_s = config.deadline_max_prefill_deferral_ms / 1000
        self.lm_step_s = config.deadline_lm_step_ms / 1000
        self.codec_s = config.deadline_codec_ms / 1000
        self.prefill_s = config.deadline_prefill_ms / 1000
        self._deferred_since: dict[str, float] = {}  # waiting req_id -> when its admission was first deferred
        self._at_risk: list[Request] = []  # streams about to underrun, this step
        self._period_s = self.lm_step_s  # measured time between planned steps (see step_period)
        self._period_samples = 0
        self._last_planned: float | None = None  # when the previous non-empty plan was made

    # ---- step period ---------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        now = self.clock()
        gap = None if self._last_planned is None else now - self._last_planned
        if gap is not None and 0 <= gap <= PERIOD_MAX_SAMPLE_FACTOR * max(self._period_s, self.lm_step_s):
            self._period_s += PERIOD_SMOOTHING * (gap - self._period_s)
            self._period_samples += 1
        plan = super().schedule()
        self._last_planned = self.now if plan.num_lm_rows else None
        return plan

    def step_period(self) -> float:
        """Seconds between two steps that decode a request: measured (an exponential average of the
        gaps between planned steps, which include host, codec and prefill time) once
        PERIOD_WARMUP_STEPS gaps were seen, else `deadline_lm_step_ms`."""
        return self._period_s if self._period_samples >= PERIOD_WARMUP_STEPS else self.lm_step_s

    # ---- deadlines -----------------------------------------------------------------------
    def deadline(self, req: Request) -> float:
        """When req's next chunk must reach its client (inf for non-streaming requests)."""
        if not req.streaming:
            return math.inf
        played_out = playback_deadline(req, self.meta.sample_rate)
        return req.stats.arrival + self.startup_s if played_out is None else played_out

    def admission_deadline(self, req: Request) -> float:
        if req.streaming:
            return self.deadline(req)
        return req.stats.arrival + NON_STREAMING_STARTUP_FACTOR * self.startup_s

    def time_to_next_chunk(self, req: Request) -> float:
        """Estimated time until req's next chunk can be sent. With more requests running than one
        batch holds, each decodes in a share of the steps only."""
        if self.has_ready_chunk(req) or req.status is RequestStatus.DRAINING:
            return self.codec_s
        window = self.geometry.chunk(req.next_chunk, math.inf, final=False)
        codes = window.window_end * self.geometry.codes_per_frame - req.num_codes
        steps = math.ceil(max(codes, 0) / self.meta.codes_per_step)
        share = min(1.0, self.limits.max_batch / max(len(self.running), 1))
        return steps * self.step_period() / share + self.codec_s

    def time_to_first_audio(self, req: Request) -> float:
        """Estimated time from admitting a waiting request to its next chunk: a prefill (of the
        prompt, or of the whole sequence after a preemption), then the decode steps to the chunk."""
        window = self.geometry.chunk(req.next_chunk, math.inf, final=False)
        codes = window.window_end * self.geometry.codes_per_frame - req.num_codes
        steps = max(math.ceil(max(codes, 0) / self.meta.codes_per_step) - 1, 0)  # the prefill samples one
        share = min(1.0, self.limits.max_batch / (len(self.running) + 1))
        return self.prefill_s + steps * self.step_period() / share + self.codec_s

    def first_audio_slack(self, req: Request) -> float:
        """How much longer a waiting stream can wait and still meet its next chunk's deadline."""
        return self.deadline(req) - self.now - self.time_to_first_audio(req)

    def realtime_capacity(self) -> float:
        """Requests the decode batch keeps real time at the current step period: a batch slot gives
        one step of `codes_per_step` codes per period; a stream needs `codes_per_frame` codes per
        frame of audio."""
        frame_s = self.meta.samples_per_frame / self.meta.sample_rate
        codes_per_slot_per_frame = frame_s / self.step_period() * self.meta.codes_per_step
        return self.limits.max_batch * codes_per_slot_per_frame / self.meta.codes_per_frame

    def slack(self, req: Request) -> float:
        return self.deadline(req) - self.now - self.time_to_next_chunk(req)

    # ---- codec ---------------------------------------------------------------------------
    def chunk_due(self, req: Request) -> bool:
        if not req.streaming:
            return req.status is RequestStatus.DRAINING
        return req.stats.first_audio is None or self.deadline(req) - self.now <= PLAYBACK_MARGIN_S

    def select_codec(self) -> None:
        ready = self.ready_requests()
        if not any(self.chunk_due(r) for r in ready):
            if ready:
                self.notes.append(f"codec held: {len(ready)} requests have ready chunks, none due")
            return
        order = sorted(ready, key=lambda r: (not self.chunk_due(r), self.deadline(r), r.stats.arrival))
        self.take_chunks(order, lambda r: "due" if self.chunk_due(r) else "joins a due batch")

    # ---- admission -----------------------------------------------------------------------
    def admission_order(self) -> list[Request]:
        return sorted(self.waiting, key=lambda r: (self.admission_deadline(r), r.stats.arrival))

    def admission_reason(self, req: Request) -> str:
        return f"{super().admission_reason(req)}, first audio due in {(self.deadline(req) - self.now) * 1000:.0f} ms"

    def defer_admissions(self) -> bool:
        """Find the streams about to underrun; each waiting request then decides in can_admit."""
        self._at_risk = [r for r in self.running + self.draining
                         if r.streaming and self.slack(r) < self.prefill_s and not waits_for_text(r)]
        if not self._at_risk:
            self._deferred_since.clear()
        for waiting in self.waiting if self._at_risk else ():
            self._deferred_since.setdefault(waiting.req_id, self.now)
        return False

    def can_admit(self, req: Request) -> bool:
        if self._at_risk:
            deferred = self.now - self._deferred_since[req.req_id]
            worst = min(self.slack(r) for r in self._at_risk) * 1000
            own = self.first_audio_slack(req) if req.streaming else math.inf
            if deferred < self.max_deferral_s and own >= self.prefill_s:
                self.notes.append(f"admissions deferred: {len(self._at_risk)} streams about to underrun "
                                  f"(least slack {worst:.0f} ms)")
                return False
            why = "its own first audio is due" if deferred < self.max_deferral_s else "the deferral limit"
            self.notes.append(f"{req.req_id} admitted after {deferred * 1000:.0f} ms deferred, {why} "
                              f"({len(self._at_risk)} streams at risk, least slack {worst:.0f} ms)")
        self._deferred_since.pop(req.req_id, None)
        if self.num_generating < self.limits.max_batch:
            return True
        if self._at_risk or self.num_generating + 1 > self.realtime_capacity():
            return False  # the batch is full and has no slack to lend: wait, as in base
        need = self.pool.pages_needed(req.req_id, req.prompt_len + 1)
        return self.pool.num_free - need > len(self.running) * self.limits.kv_streams  # a page each to grow

    # ---- decode --------------------------------------------------------------------------
    def decode_order(self, candidates: list[Request]) -> list[Request]:
        def key(req: Request) -> tuple:
            last = self.table.last_decode[req.slot]  # NaN before its first row: never "waited too long"
            if self.now - last >= self.max_deferral_s:
                return (0, last, req.stats.arrival)  # waited too long: first, whatever its deadline
            return (1, self.deadline(req), req.stats.arrival)

        order = sorted(candidates, key=key)
        if len(order) > self.limits.max_batch:
            for req in order[: self.limits.max_batch]:
                self.reasons["decode"][req.req_id] = "earliest deadline"
        return order

    def next_wakeup(self) -> float | None:
        times = [self.deadline(r) - PLAYBACK_MARGIN_S for r in self.ready_requests() if r.streaming]
        times += [since + self.max_deferral_s for since in self._deferred_since.values()]
        times += [self.now + self.first_audio_slack(r) - self.prefill_s for r in self.waiting
                  if r.streaming and r.req_id in self._deferred_since]
        return min((t for t in times if t > self.now), default=None)

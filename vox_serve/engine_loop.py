"""The Python runtime's core loop: schedule, execute, update (scheduler and worker in one process).

Synchronous (default): plan a step, run it, apply its results. With `--async-scheduling` the
loop plans and launches step k+1 before it collects step k, so the host plans while the device
runs; a request decoding in both steps takes its input for k+1 from its slot's token history on
the device, where step k writes it. Any worker with `launch(plan) -> handle` and `collect(handle)
-> StepResult` drives it: the engine worker, or the simulated engine (vox_serve/sim).

`record=True` (tests, debugging) copies each request's generated tokens and codes back from the
device when it ends (`worker.read_outputs`) into `Request.tokens` / `Request.codes`; serving never
reads them.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from vox_serve.core.plan import StepPlan, StepResult
from vox_serve.rt.nvtx import nvtx_range
from vox_serve.scheduler.base import Scheduler
from vox_serve.trace import Tracer

log = logging.getLogger(__name__)
MAX_IDLE_STEPS = 3  # empty plans in a row, with requests waiting, before the queue head is stalled
TEXT_WAIT_S = 0.05  # longest wait when only text that has not arrived can unblock the requests


class Worker(Protocol):
    timer: str  # what stage times measure: "cuda" events, "wall" time or a "sim" cost model

    def launch(self, plan: StepPlan) -> Any: ...

    def collect(self, handle: Any) -> StepResult: ...

    def read_outputs(self, slot: int, num_tokens: int, num_codes: int) -> tuple[list[list[int]], list[int]]: ...

    # Optional: `early_pcm(handle) -> list[bytes | memoryview] | None`, the PCM of a launched step's codec rows
    # once the device has made it, before the step's LM rows end (None: it comes with the step's result).


class EngineLoop:
    def __init__(self, scheduler: Scheduler, worker: Worker, async_scheduling: bool | None = None,
                 tracer: Tracer | None = None, nvtx: bool = False, record: bool = False) -> None:
        self.scheduler, self.worker = scheduler, worker
        if record:
            scheduler.on_release = self._record
        self.nvtx = nvtx
        config = scheduler.config
        self.async_scheduling = config.async_scheduling if async_scheduling is None else async_scheduling
        if tracer is None and config.trace_dir:
            tracer = Tracer(config.trace_dir, getattr(worker, "timer", "wall"))
        self.tracer = tracer
        if tracer is not None:
            tracer.header(scheduler)
        self.num_steps = 0
        self._idle_steps = 0
        self._in_flight: tuple[StepPlan, Any] | None = None

    def _record(self, req: Any) -> None:
        req.tokens, req.codes = self.worker.read_outputs(req.slot, req.num_generated, req.num_codes)

    @property
    def busy(self) -> bool:
        """Requests left or a step still on the device."""
        return self.scheduler.has_work() or self._in_flight is not None

    def step(self) -> bool:
        """One step; False when nothing was launched or collected. A failing step fails only its requests.

        A step whose PCM the worker gives early (`early_pcm`) hands it to its requests as soon as the device
        has made it; synchronously, such a step is then collected at the start of the next call, so that the
        caller sends the audio on while the step's LM rows still run."""
        collected = False
        if not self.async_scheduling and self._in_flight is not None:
            self.drain()
            collected = True
        start = time.perf_counter()
        with nvtx_range("schedule", self.nvtx):
            plan = self.scheduler.schedule()
        launched = None
        if not plan.is_empty:
            self.num_steps += 1
            if self.tracer is not None:
                self.tracer.decision(self.scheduler, plan, time.perf_counter() - start)
            launched = self._launch(plan)
        previous, self._in_flight = self._in_flight, launched
        if previous is not None:
            self._collect(*previous)
            collected = True
        if not self._land_early() and not self.async_scheduling:
            self.drain()
        return not plan.is_empty or collected

    def _land_early(self) -> bool:
        """The PCM of the step in flight, if the worker gives it before the step ends; whether it did."""
        early = getattr(self.worker, "early_pcm", None)
        if self._in_flight is None or early is None:
            return False
        plan, handle = self._in_flight
        try:
            pcm = early(handle)
        except Exception as exc:
            log.error("the codec rows of step %d failed: %s", plan.step_id, exc)
            self.scheduler.fail_chunks(plan.codec.req_ids, f"{type(exc).__name__}: {exc}")
            return True
        if pcm is None:
            return False
        self.scheduler.land_early(plan, pcm)
        return True

    def drain(self) -> None:
        """Collect the step in flight, if any."""
        previous, self._in_flight = self._in_flight, None
        if previous is not None:
            self._collect(*previous)

    def _launch(self, plan: StepPlan) -> tuple[StepPlan, Any] | None:
        try:
            return plan, self.worker.launch(plan)
        except Exception as exc:  # the server must outlive any one step
            self._fail(plan, exc)
            return None

    def _collect(self, plan: StepPlan, handle: Any) -> None:
        try:
            result = self.worker.collect(handle)
        except Exception as exc:
            self._fail(plan, exc)
            return
        if self.tracer is not None:
            self.tracer.stages(plan, result)
        self.scheduler.update(plan, result)

    def _fail(self, plan: StepPlan, exc: Exception) -> None:
        log.error("step %d failed: %s\n%s", plan.step_id, exc, traceback.format_exc())
        self.scheduler.fail(plan, f"{type(exc).__name__}: {exc}")

    def poll(self) -> float | None:
        """Step once if there is work. Returns None when idle, else how long the caller may wait
        (0 after a step; the policy's own delay when it holds audio back).

        Empty plans in a row, with nothing held back, mean the head of the queue can never be
        admitted (nothing runs that could free pages): it is failed rather than left to spin. While
        requests wait for streamed text, their text (a message) is what the loop waits for.
        """
        if not self.busy:
            return None
        if self.step():
            self._idle_steps = 0
            return 0.0
        wake = self.scheduler.next_wakeup()
        if wake is not None:
            return max(wake - self.scheduler.clock(), 0.0)
        if self.scheduler.num_waiting_for_text:
            return TEXT_WAIT_S
        self._idle_steps += 1
        if self._idle_steps >= MAX_IDLE_STEPS and self.scheduler.waiting:
            self._idle_steps = 0
            self.scheduler.abort(self.scheduler.waiting[0].req_id, "stalled: the KV cache cannot hold this request")
        return 0.001

    def run_until_idle(self, sleep: Callable[[float], None] = time.sleep,
                       on_poll: Callable[[], None] | None = None, arrivals: Arrivals | None = None) -> None:
        """Step until no request is left (bench mode, tests and the simulator); `on_poll` runs after
        every poll (bench mode's progress display). With `arrivals` (bench mode's open-loop phases),
        their requests are queued when due, and while nothing else is to be done the loop sleeps
        until the next one is."""
        while True:
            if arrivals is not None:
                arrivals.admit_due()
            wait = self.poll()
            if on_poll is not None:
                on_poll()
            until = arrivals.seconds_to_next() if arrivals is not None else None
            if wait is None and until is None:
                break
            delay = min(d for d in (wait, until) if d is not None)
            if delay > 0:
                sleep(delay)
        if self.tracer is not None:
            self.tracer.flush()


class Arrivals(Protocol):
    """Requests that arrive while the loop runs."""

    def admit_due(self) -> None:
        """Queue every request whose arrival time has come."""

    def seconds_to_next(self) -> float | None:
        """Seconds until the next arrival (0 when overdue); None when none is left."""

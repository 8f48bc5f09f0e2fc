"""The Python runtime's core loop: schedule, execute, update (scheduler and worker in one process)."""

from __future__ import annotations

import logging
import traceback

from vox_serve.scheduler.base import Scheduler
from vox_serve.worker.program_worker import ProgramWorker

log = logging.getLogger(__name__)


class EngineLoop:
    def __init__(self, scheduler: Scheduler, worker: ProgramWorker) -> None:
        self.scheduler, self.worker = scheduler, worker
        self.num_steps = 0

    def step(self) -> bool:
        """One step; False when there was nothing to run. A failing step fails only its requests."""
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return False
        self.num_steps += 1
        try:
            result = self.worker.execute(plan)
        except Exception as exc:  # the server must outlive any one step
            log.error("step %d failed: %s\n%s", plan.step_id, exc, traceback.format_exc())
            self.scheduler.fail(plan, f"{type(exc).__name__}: {exc}")
            return True
        self.scheduler.update(plan, result)
        return True

    def run_until_idle(self, max_idle_steps: int = 3) -> None:
        """Step until no request is left.

        Empty plans while requests remain mean the head of the queue can never be admitted (nothing
        runs that could free pages): fail it rather than spin forever.
        """
        idle = 0
        while self.scheduler.has_work():
            if self.step():
                idle = 0
                continue
            idle += 1
            if idle >= max_idle_steps and self.scheduler.waiting:
                head = self.scheduler.waiting[0]
                self.scheduler.abort(head.req_id, "stalled: the KV cache cannot hold this request")
                idle = 0

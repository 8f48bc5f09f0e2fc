"""Step time by stage, accumulated in a replica and exported by the API's /metrics (pure Python).

The replica keeps, per stage (prefill, decode, codec, codec_first), a cumulative histogram of launch
times over fixed buckets, and sends it with every Stats message; cumulative counts survive a lost
message, and the API exports them as Prometheus histograms as they are.
"""

from __future__ import annotations

import bisect
from typing import Any

from vox_serve.core.plan import StepPlan, StepResult

STAGE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class StageStats:
    def __init__(self) -> None:
        # stage -> [count, sum of seconds, one count per bucket (non-cumulative; the last is +Inf)]
        self.stages: dict[str, list[float]] = {}

    def observe(self, stage: str, seconds: float) -> None:
        row = self.stages.setdefault(stage, [0, 0.0] + [0] * (len(STAGE_BUCKETS_S) + 1))
        row[0] += 1
        row[1] += seconds
        row[2 + bisect.bisect_left(STAGE_BUCKETS_S, seconds)] += 1

    def to_wire(self) -> dict[str, list[float]]:
        return {stage: list(row) for stage, row in self.stages.items()}


class TimedWorker:
    """A worker (`launch(plan)`, `collect(handle)`) whose collected stage times feed a StageStats."""

    def __init__(self, worker: Any, stats: StageStats) -> None:
        self.worker, self.stats = worker, stats
        self.timer = getattr(worker, "timer", "wall")

    def launch(self, plan: StepPlan) -> Any:
        return self.worker.launch(plan)

    def collect(self, handle: Any) -> StepResult:
        result = self.worker.collect(handle)
        for stage, seconds in result.stage_seconds.items():
            self.stats.observe(stage, seconds)
        return result

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped worker's
        return getattr(self.worker, name)

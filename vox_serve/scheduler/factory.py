"""`--scheduler-type` -> a Scheduler. `input_streaming` is a name of `base`."""

from __future__ import annotations

import time
from collections.abc import Callable

from vox_serve.config import SchedulerConfig
from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.scheduler.base import Scheduler
from vox_serve.scheduler.deadline import DeadlineScheduler
from vox_serve.scheduler.offline import OfflineScheduler
from vox_serve.scheduler.online import OnlineScheduler

POLICIES: dict[str, type[Scheduler]] = {
    "base": Scheduler,
    "input_streaming": Scheduler,
    "online": OnlineScheduler,
    "offline": OfflineScheduler,
    "deadline": DeadlineScheduler,
}


def make_scheduler(meta: ProgramMeta, limits: EngineLimits, config: SchedulerConfig,
                   clock: Callable[[], float] = time.monotonic) -> Scheduler:
    try:
        policy = POLICIES[config.scheduler_type]
    except KeyError:
        raise ValueError(f"unknown scheduler type {config.scheduler_type!r}; "
                         f"expected one of {', '.join(POLICIES)}") from None
    return policy(meta, limits, config, clock)

"""How many cores a CPU engine's intra-op threads may take: the cores this process may run on, less those other
processes keep busy.

Threads beyond the free cores are worse than slow: on a 2-core machine with two other busy processes the README's
main job took 16-50 s with 2 threads against 4 s with 1 (OpenMP's threads wait for each other at every op while
one of them is descheduled). The 1-minute load average alone misses a load that started seconds ago, so the tasks
runnable right now count too.
"""

from __future__ import annotations

import os
from pathlib import Path

LOADAVG = Path("/proc/loadavg")
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def available_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The cores this process may run on: its CPU affinity (all the machine's where it has none), capped by a
    cgroup v2 CPU quota (whole cores, at least one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        limit, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    if limit == "max":
        return cores
    return max(1, min(cores, int(limit) // int(period)))


def busy_cores(loadavg: Path = LOADAVG) -> int:
    """Cores other processes keep busy: the 1-minute load average or the tasks runnable now besides the one
    reading (/proc/loadavg's fourth field), whichever is more; the load average alone without /proc."""
    try:
        fields = loadavg.read_text().split()
        return max(int(float(fields[0])), int(fields[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return int(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0


def idle_cores() -> int:
    """The cores left for this process's threads (at least one)."""
    return max(1, available_cores() - busy_cores())

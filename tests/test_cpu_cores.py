"""vox_serve/cpu_cores.py: the cores a CPU engine's threads may take, from the CPU affinity, a cgroup quota and
the load (the 1-minute average, or the tasks runnable now when a load has just started)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vox_serve import cpu_cores


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_busy_cores_counts_a_load_that_the_average_has_not_caught_up_with(tmp_path: Path) -> None:
    # Two busy loops started a second ago: the average still near 0, three tasks runnable (with the reader).
    assert cpu_cores.busy_cores(_file(tmp_path, "a", "0.12 0.65 0.78 3/88 26651\n")) == 2
    # A quiet machine: only the reader runs.
    assert cpu_cores.busy_cores(_file(tmp_path, "b", "0.12 0.65 0.78 1/88 26651\n")) == 0
    # A long load that is idle right now: the average still counts.
    assert cpu_cores.busy_cores(_file(tmp_path, "c", "1.90 1.40 0.90 1/88 26651\n")) == 1


def test_busy_cores_without_proc_falls_back_to_the_load_average(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (3.5, 0.0, 0.0))
    assert cpu_cores.busy_cores(tmp_path / "missing") == 3
    assert cpu_cores.busy_cores(_file(tmp_path, "bad", "garbage\n")) == 3


def test_available_cores_is_the_affinity_capped_by_a_cgroup_quota(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert cpu_cores.available_cores(tmp_path / "missing") == 8
    assert cpu_cores.available_cores(_file(tmp_path, "unlimited", "max 100000\n")) == 8
    assert cpu_cores.available_cores(_file(tmp_path, "two", "200000 100000\n")) == 2
    assert cpu_cores.available_cores(_file(tmp_path, "half", "50000 100000\n")) == 1  # at least one core
    assert cpu_cores.available_cores(_file(tmp_path, "more", "1600000 100000\n")) == 8  # not above the affinity


def test_idle_cores_is_at_least_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_cores, "available_cores", lambda: 2)
    monkeypatch.setattr(cpu_cores, "busy_cores", lambda: 0)
    assert cpu_cores.idle_cores() == 2
    monkeypatch.setattr(cpu_cores, "busy_cores", lambda: 2)
    assert cpu_cores.idle_cores() == 1
    monkeypatch.setattr(cpu_cores, "busy_cores", lambda: 5)
    assert cpu_cores.idle_cores() == 1

"""Shared scheduler scenarios (tests/scenarios/*.json, vox_serve/sim/scenario.py): each runs against
the Python scheduler on the Python simulated engine and against the Rust scheduler on the Rust
side's simulated engine. Both simulated engines check the plan contract every step (a broken plan
fails its requests); here both runs are held to the same invariants, to the scenario's expected
orderings, and to each other: the same decisions, step for step."""

from __future__ import annotations

from pathlib import Path

import pytest
from rust_helpers import require_rt

from vox_serve.sim.scenario import Scenario, ScenarioRun, load_scenario, run_python, run_rust

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.json"))
TIMES = ("t", "plan_ms", "device_ms")  # host timings differ; the virtual times are checked apart


def _first_audio(r: dict) -> float:
    return r["chunks"][0][0] if r["chunks"] else float("inf")


def check_invariants(s: Scenario, run: ScenarioRun) -> None:
    errors = s.expect.get("errors", {})
    assert [r["req_id"] for r in run.requests] == [a.req_id for a in sorted(s.arrivals, key=lambda a: a.t)]
    for r in run.requests:
        who = f"{run.runtime}: {r['req_id']}"
        if r["req_id"] in errors:
            assert r["error"] is not None and errors[r["req_id"]] in r["error"], who
            continue
        assert r["error"] is None and r["finish_reason"] == "stop", f"{who}: {r}"
        times = [t for t, _ in r["chunks"]]
        assert times and times == sorted(times) and times[0] >= r["sent"], who
        assert r["finished"] >= times[-1], who
    steps = [x["step"] for x in run.records if x["type"] == "schedule"]  # empty plans are not recorded
    assert steps and all(a < b for a, b in zip(steps, steps[1:], strict=False)), run.runtime


def check_expectations(s: Scenario, run: ScenarioRun) -> None:
    done = [r for r in run.requests if r["error"] is None]
    by_first = [r["req_id"] for r in sorted(done, key=lambda r: (_first_audio(r), r["req_id"]))]
    by_end = [r["req_id"] for r in sorted(done, key=lambda r: (r["finished"], r["req_id"]))]
    e = s.expect
    if "first_audio_order" in e:
        assert by_first == e["first_audio_order"], run.runtime
    if "finish_order" in e:
        assert by_end == e["finish_order"], run.runtime
    if "finishes_first" in e:
        assert by_end[0] == e["finishes_first"], run.runtime
    for req_id, limit in e.get("max_ttfa_s", {}).items():
        r = next(r for r in run.requests if r["req_id"] == req_id)
        assert _first_audio(r) - r["sent"] <= limit, f"{run.runtime}: {req_id}"


def _timeless(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMES} for r in records[1:]]  # the header names the runtime


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_python_scheduler_scenario(path: Path) -> None:
    s = load_scenario(path)
    run = run_python(s)
    check_invariants(s, run)
    check_expectations(s, run)


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_rust_scheduler_scenario_matches_python(path: Path) -> None:
    require_rt()
    s = load_scenario(path)
    py, rs = run_python(s), run_rust(s)
    check_invariants(s, rs)
    check_expectations(s, rs)
    assert _timeless(rs.records) == _timeless(py.records)
    for a, b in zip(rs.requests, py.requests, strict=True):
        assert [n for _, n in a["chunks"]] == [n for _, n in b["chunks"]], a["req_id"]
        assert [t for t, _ in a["chunks"]] == pytest.approx([t for t, _ in b["chunks"]]), a["req_id"]
        assert a["finished"] == pytest.approx(b["finished"]), a["req_id"]


def test_scenarios_cover_every_policy_and_input_streaming() -> None:
    scenarios = [load_scenario(p) for p in SCENARIOS]
    assert {s.config.scheduler_type for s in scenarios} >= {"base", "online", "offline", "deadline"}
    assert any(a.text_end is not None for s in scenarios for a in s.arrivals)
    preempted = any("preempted" in " ".join(x.get("notes", [])) for x in
                    run_python(next(s for s in scenarios if s.name == "base-preempt")).records)
    assert preempted, "base-preempt must preempt"

"""Shared scheduler scenarios: one scenario file runs against the Python scheduler on the simulated
engine (vox_serve/sim/) and against the Rust scheduler on the Rust side's simulated engine
(`vox_serve._rt.simulate`); tests/test_scheduler_scenarios.py holds both to the same invariants,
the same expected orderings, and to each other's decisions.

A scenario (JSON, tests/scenarios/*.json):
- `profile`: a cost profile's name (benchmark/profiles) or an inline `{"meta": ..., "costs": ...}`;
- `policy`, and `scheduler`: SchedulerConfig overrides; `engine`: EngineOptions (the simulated limits);
- `arrivals`: Arrival fields (send time, prompt length, frames before the stop, streamed text pieces);
- `expect`: what must hold in both runtimes (`first_audio_order`, `finish_order`, `errors`).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vox_serve.config import SchedulerConfig
from vox_serve.core.meta import EngineLimits
from vox_serve.sim.cost import Profile, load_profile
from vox_serve.sim.driver import EngineOptions, Simulation, scheduler_config
from vox_serve.sim.workload import Arrival


@dataclass
class ScenarioRun:
    """One runtime's run of a scenario: the trace records (header first) and each client's view
    (`req_id`, `sent`, `chunks` [(time, samples)], `finished`, `error`, `finish_reason`)."""

    runtime: str
    records: list[dict[str, Any]]
    requests: list[dict[str, Any]]


@dataclass
class Scenario:
    name: str
    profile: Profile
    limits: EngineLimits
    config: SchedulerConfig
    arrivals: list[Arrival]
    expect: dict[str, Any]


def load_scenario(path: Path) -> Scenario:
    data = json.loads(path.read_text())
    raw = data["profile"]
    if isinstance(raw, dict):
        profile = Profile.from_dict({"name": data["name"], **raw})
    else:  # a file next to the scenario, or a profile of benchmark/profiles
        profile = load_profile(str(path.parent / raw) if (path.parent / raw).is_file() else raw)
    limits = EngineOptions(**data.get("engine", {})).limits(profile.meta)
    config = scheduler_config(data["policy"], profile.costs, limits, **data.get("scheduler", {}))
    arrivals = [Arrival(**{**a, "text_pieces": tuple(tuple(p) for p in a.get("text_pieces", ()))})
                for a in data["arrivals"]]
    return Scenario(data["name"], profile, limits, config, arrivals, data.get("expect", {}))


def run_python(s: Scenario) -> ScenarioRun:
    with tempfile.TemporaryDirectory() as trace_dir:
        sim = Simulation(s.profile, s.config, s.limits, s.arrivals, trace_dir=trace_dir)
        run = sim.run()
        (path,) = Path(trace_dir).glob("*.jsonl")
        records = [json.loads(line) for line in path.read_text().splitlines()]
    requests = []
    for t in run.traces:
        req = sim.requests.get(t.req_id)
        requests.append({"req_id": t.req_id, "sent": t.sent, "chunks": [list(c) for c in t.chunks],
                         "finished": t.finished, "error": t.error,
                         "finish_reason": None if req is None else req.finish_reason})
    return ScenarioRun("python", records, requests)


def rust_scenario_json(s: Scenario) -> str:
    """The scenario as `_rt.simulate` reads it."""
    return json.dumps({"meta": s.profile.meta.to_dict(), "limits": dataclasses.asdict(s.limits),
                       "scheduler": dataclasses.asdict(s.config), "costs": s.profile.raw["costs"],
                       "arrivals": [dataclasses.asdict(a) for a in s.arrivals]})


def run_rust(s: Scenario) -> ScenarioRun:
    from vox_serve import _rt

    out = json.loads(_rt.simulate(rust_scenario_json(s)))
    return ScenarioRun("rust", out["records"], out["requests"])

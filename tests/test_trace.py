"""--trace-dir: JSON lines of every scheduling decision and stage launch."""

from __future__ import annotations

from pathlib import Path

from tests.engine_helpers import make_loop
from tests.orpheus_helpers import make_program, run_requests
from tests.sim_helpers import COSTS, PROFILE
from vox_serve.sim.driver import EngineOptions, simulate
from vox_serve.sim.workload import Arrival
from vox_serve.trace import Tracer, read_trace


def test_simulated_run_traces_decisions_with_reasons_and_stage_times(tmp_path: Path) -> None:
    arrivals = [Arrival(0.0, "a", 10, 30), Arrival(0.05, "b", 12, 30, streaming=False)]
    simulate(PROFILE, "online", arrivals, EngineOptions(max_batch=4, max_model_len=256), trace_dir=str(tmp_path))
    records = list(read_trace(tmp_path))
    assert records[0]["type"] == "header" and records[0]["policy"] == "online"
    assert records[0]["meta"]["name"] == "toy" and records[0]["limits"]["max_batch"] == 4
    decisions = [r for r in records if r["type"] == "schedule"]
    stages = [r for r in records if r["type"] == "stage"]
    assert decisions[0]["prefill"] == [["a", 10, "new"]]
    assert {"waiting", "running", "draining"} <= decisions[0]["queue"].keys()
    assert decisions[0]["kv"]["used_pages"] == 1  # 10 prompt tokens in a page of 16
    reasons = {why for d in decisions for _, _, why in d["codec"]}
    assert reasons == {"pressing", "joins a pressing batch"} or reasons == {"pressing"}
    assert any("codec held" in n for d in decisions for n in d["notes"])
    assert all(r["timer"] == "sim" for r in stages)
    decode = [r for r in stages if r["stage"] == "decode"]
    assert decode and all(abs(r["device_ms"] - COSTS.decode_ms(r["rows"])) < 1e-6 for r in decode)
    assert {r["step"] for r in stages} <= {d["step"] for d in decisions}


def test_real_worker_traces_wall_time_of_every_stage_on_cpu(tiny_orpheus_dir: Path, tmp_path: Path) -> None:
    program, config = make_program(tiny_orpheus_dir)
    tracer = Tracer(tmp_path, timer="wall")
    loop = make_loop(program, config, tracer=tracer)
    run_requests(program, config, [{"text": "Hi there.", "max_tokens": 28, "ignore_eos": True}], loop=loop)
    tracer.close()
    records = list(read_trace(tracer.path))
    stages = [r for r in records if r["type"] == "stage"]
    assert {r["stage"] for r in stages} == {"prologue", "prefill", "decode", "codec"}
    assert all(r["device_ms"] > 0 and r["timer"] == "wall" for r in stages)
    assert len([r for r in records if r["type"] == "schedule"]) == len({r["step"] for r in stages})

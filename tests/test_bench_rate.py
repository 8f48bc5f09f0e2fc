"""`--bench-rate`: bench mode under an open-loop load, in both runtimes. Each rate is a phase of
`--bench-requests N` Poisson arrivals on the same engine; every phase is reported by one
implementation (vox_serve/bench_report.py) with TTFA measured from each request's own arrival."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rust_helpers import require_rt
from sim_helpers import Bench

from vox_serve.bench import PhaseArrivals
from vox_serve.bench_report import BenchOutcome, BenchPhase, BenchRecorder, bench_phases
from vox_serve.config import BenchConfig, ModelConfig, VoxConfig
from vox_serve.core.request import Prompt, Request, SamplingParams
from vox_serve.engine_loop import EngineLoop
from vox_serve.launch import main
from vox_serve.metrics import arrival_times, percentile

SUMMARY = re.compile(r"summary: (\d+)/(\d+) done, (\d+) failed; ttfa p50 ([\d.]+)ms p95 ([\d.]+)ms p99 ([\d.]+)ms; "
                     r"viability ([\d.]+)% all-chunks ([\d.]+)% underruns (\d+); throughput ([\d.]+)x$")
SUMMARY_KEYS = {"num_requests", "num_completed", "num_failed", "ttfa_p50", "ttfa_p95", "ttfa_p99", "viability",
                "all_chunks", "underruns", "throughput", "audio_seconds", "duration"}


def test_arrival_times_are_poisson_from_zero_and_repeatable_per_seed() -> None:
    offsets = arrival_times(20000, 4.0, 1.0, seed=3)
    assert offsets[0] == 0.0 and offsets == arrival_times(20000, 4.0, 1.0, seed=3)
    assert offsets != arrival_times(20000, 4.0, 1.0, seed=4)
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert min(gaps) >= 0.0
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.05)  # exponential: std = mean
    gamma = arrival_times(20000, 4.0, 4.0, seed=3)
    gamma_gaps = [b - a for a, b in zip(gamma, gamma[1:], strict=False)]
    assert statistics.pstdev(gamma_gaps) == pytest.approx(0.125, rel=0.05)  # shape 4: std = mean / 2
    slower = arrival_times(100, 2.0, 1.0, seed=3)
    assert slower == pytest.approx([2 * t for t in offsets[:100]])  # the same draws, scaled by the rate


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
def test_arrival_times_refuse_a_rate_that_is_not_finite_and_positive(rate: float) -> None:
    with pytest.raises(ValueError, match="rate"):
        arrival_times(3, rate, 1.0, seed=0)


def _config(tmp_path: Path, rates: tuple[float, ...], n: int = 2) -> VoxConfig:
    return VoxConfig(model=ModelConfig(model="orpheus-tiny", seed=5),
                     bench=BenchConfig(num_requests=n, rates=rates, json_path=str(tmp_path / "run.json")))


def test_phases_name_their_requests_and_take_arrivals_from_the_shared_definition(tmp_path: Path) -> None:
    (only,) = bench_phases(_config(tmp_path, ()))
    assert only.req_ids == ("bench-000", "bench-001") and only.offsets == (0.0, 0.0) and only.seeds == (5, 6)
    at_once, poisson = bench_phases(_config(tmp_path, (0.0, 3.0)))
    assert at_once.req_ids == ("bench-p0-000", "bench-p0-001") and at_once.offsets == (0.0, 0.0)
    assert poisson.req_ids == ("bench-p1-000", "bench-p1-001")
    assert list(poisson.offsets) == arrival_times(2, 3.0, 1.0, seed=5) and poisson.offsets[1] > 0


def test_a_bench_duration_sizes_each_poisson_phase_by_its_rate(tmp_path: Path) -> None:
    """--bench-duration S: a phase at rate R sends R x S requests (at least one); all at once keeps N."""
    config = _config(tmp_path, (0.0, 3.0, 0.1, 12.5), n=4)
    config = dataclasses.replace(config, bench=dataclasses.replace(config.bench, duration_s=2.0))
    at_once, three, slow, fast = bench_phases(config)
    assert [len(p.req_ids) for p in (at_once, three, slow, fast)] == [4, 6, 1, 25]
    assert list(fast.offsets) == arrival_times(25, 12.5, 1.0, seed=5) and fast.req_ids[-1] == "bench-p3-024"


def test_phase_summary_measures_ttfa_from_each_arrival(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Two requests at 1 kHz: one arriving at 0 s, one at 1 s whose first chunk comes at 1.3 s (TTFA 0.3 s,
    not 1.3 s); its second chunk comes after the first chunk's 0.1 s of audio has run out: one underrun."""
    recorder = BenchRecorder(_config(tmp_path, (0.0, 3.0), n=3), "tiny", sample_rate=1000)
    first = BenchOutcome("bench-p1-000", 0.0, admitted=0.0, finished=0.5, finish_reason="length", num_generated=7)
    first.add_chunk(0.1, b"\0\0" * 200)
    first.add_chunk(0.2, b"\0\0" * 200)
    second = BenchOutcome("bench-p1-001", 1.0, admitted=1.01, finished=1.6, finish_reason="length", num_generated=7)
    second.add_chunk(1.3, b"\0\0" * 100)
    second.add_chunk(1.5, b"\0\0" * 100)
    refused = BenchOutcome("bench-p1-002", 1.2, finish_reason="error", error="prompt too long")
    recorder.phase_done(1, [first, second, refused], wall=1.5)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "phase 1: 3 requests, Poisson arrivals at 3/s"
    assert out[2].split()[:2] == ["bench-p1-000", "100.0"] and out[3].split()[:3] == ["bench-p1-001", "300.0", "0.60"]
    assert out[4].split()[:2] == ["bench-p1-002", "-"] and out[4].endswith("error (prompt too long)")
    match = SUMMARY.match(out[5])
    assert match and match.groups()[:6] == ("2", "3", "1", "200.0", "290.0", "298.0"), out[5]
    assert match.group(7) == "50.0" and match.group(8) == "50.0" and match.group(9) == "1"
    assert out[6].startswith("total audio 0.60s in 1.50s wall: RTF 0.40x")
    (phase,) = json.loads((tmp_path / "run.json").read_text())["phases"]
    assert phase["rate"] == 3.0 and phase["ttfa_p50"] == pytest.approx(0.2)
    assert phase["throughput"] == pytest.approx(0.6 / 1.6)  # audio s per s from the first arrival to the last end
    assert [r["ttfa_s"] for r in phase["requests"]] == pytest.approx([0.1, 0.3, None])
    assert recorder.finish() == 1


def test_the_python_loop_queues_arrivals_on_time_and_sleeps_until_the_next_one() -> None:
    """On the simulated engine (virtual clock): the first request ends long before the second arrives at
    5 s; the idle loop then sleeps once, until that arrival, and queues it no earlier."""
    sim = Bench("base")
    phase = BenchPhase(index=0, rate=0.4, req_ids=("a", "b"), seeds=(0, 1), offsets=(0.0, 5.0))
    requests = []
    for req_id in phase.req_ids:
        requests.append(Request(req_id, Prompt.of([[1]] * 6), SamplingParams(temperature=0.0, max_tokens=12)))
        sim.worker.set_length(req_id, 5)
    arrivals = PhaseArrivals(sim.scheduler, phase, requests, clock=sim.clock)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        sim.clock.advance(seconds)

    EngineLoop(sim.scheduler, sim.worker).run_until_idle(sleep=sleep, arrivals=arrivals)
    first, second = arrivals.outcomes
    assert first.admitted == 0.0 and first.finished is not None and first.finished < 1.0
    assert sleeps == [pytest.approx(5.0 - first.finished)]  # one sleep while idle: no spinning
    assert second.admitted == pytest.approx(5.0) and second.admitted >= 5.0
    assert second.ttfa is not None and 0 < second.ttfa < 1.0 and second.finish_reason == "stop"


def _bench(runtime: str, out: Path, *extra: str, device: str = "cpu") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "vox_serve.launch", "--runtime", runtime, "--model", "orpheus-tiny", "--device",
           device, "--greedy", "--bench-out", str(out), "--bench-kwargs", '{"max_tokens": 42, "ignore_eos": true}',
           "--bench-requests", "3", "--bench-rate", "inf,6", "--bench-json", str(out / "bench.json"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "VOX_GIT_COMMIT": "abc1234"})


@pytest.fixture(params=["python", "rust"])
def runtime(request: pytest.FixtureRequest) -> str:
    if request.param == "rust":
        require_rt()
    return request.param


def _check_phases(proc: subprocess.CompletedProcess, out: Path, runtime: str) -> None:
    """_bench's two phases (all at once, then Poisson at 6/s) of 3 requests on one engine: each phase's summary
    on stdout and in --bench-json, every request queued no earlier than its arrival, TTFA from that arrival."""
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("ready in") == 1  # one engine for both phases
    lines = proc.stdout.splitlines()
    assert [line for line in lines if line.startswith("phase ")] == [
        "phase 0: 3 requests, all at once", "phase 1: 3 requests, Poisson arrivals at 6/s"]
    summaries = [SUMMARY.match(line) for line in lines if line.startswith("summary:")]
    assert len(summaries) == 2 and all(summaries), lines
    assert sorted(p.name for p in out.glob("*.wav")) == [f"bench-p{k}-{i:03d}.wav" for k in range(2) for i in range(3)]
    result = json.loads((out / "bench.json").read_text())
    assert result["runtime"] == runtime and result["model"] == "orpheus-tiny" and result["git_commit"] == "abc1234"
    assert "--bench-rate inf,6" in result["command"]
    assert [p["rate"] for p in result["phases"]] == [None, 6.0]
    printed = {line.split()[0]: float(line.split()[1]) for line in lines if line.startswith("bench-p")}
    for phase, summary in zip(result["phases"], summaries, strict=True):
        assert SUMMARY_KEYS <= set(phase) and phase["num_requests"] == 3 and phase["num_completed"] == 3
        requests = phase["requests"]
        offsets = [r["offset_s"] for r in requests]
        assert offsets == ([0.0] * 3 if phase["rate"] is None else arrival_times(3, 6.0, 1.0, seed=0))
        for r in requests:
            assert r["admitted_s"] >= r["offset_s"] and r["first_audio_s"] > r["admitted_s"]
            assert r["ttfa_s"] == pytest.approx(r["first_audio_s"] - r["offset_s"])
            assert printed[r["req_id"]] == pytest.approx(r["ttfa_s"] * 1000, abs=0.06)  # the line's TTFA, too
            assert r["finish"] == "length" and r["tokens"] == 42 and r["num_chunks"] == 3
        assert phase["ttfa_p50"] == pytest.approx(percentile([r["ttfa_s"] for r in requests], 50))
        assert float(summary.group(4)) == pytest.approx(phase["ttfa_p50"] * 1000, abs=0.06)
    assert result["phases"][1]["requests"][2]["offset_s"] > 0.05  # a later arrival: TTFA is not from the start


def test_bench_rate_runs_phases_and_reports_each(runtime: str, tmp_path: Path) -> None:
    _check_phases(_bench(runtime, tmp_path), tmp_path, runtime)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_bench_rate_on_cuda_in_both_runtimes(tmp_path: Path) -> None:
    """On a GPU each Rust phase runs on a scheduler thread of its own over the same captured engine; the
    all-at-once phase's WAVs equal the Python runtime's, as plain bench mode's do."""
    require_rt()
    for runtime in ("python", "rust"):
        _check_phases(_bench(runtime, tmp_path / runtime, device="cuda"), tmp_path / runtime, runtime)
    for i in range(3):
        name = f"bench-p0-{i:03d}.wav"
        assert (tmp_path / "rust" / name).read_bytes() == (tmp_path / "python" / name).read_bytes(), name


@pytest.mark.parametrize(("argv", "message"), [
    (["--bench-requests", "2", "--bench-rate", "-1"], "--bench-rate '-1': '-1' is not a rate"),
    (["--bench-requests", "2", "--bench-rate", "4,abc"], "--bench-rate '4,abc': 'abc' is not a rate"),
    (["--bench-requests", "2", "--bench-rate", "nan"], "--bench-rate 'nan': 'nan' is not a rate"),
    (["--bench-rate", "4"], "--bench-rate needs --bench-requests N"),
    (["--bench-json", "x.json"], "--bench-json needs --bench-requests N"),
    (["--bench-requests", "2", "--bench-duration", "5"], "--bench-duration sets how long each --bench-rate phase"),
    (["--bench-requests", "2", "--bench-rate", "4", "--bench-duration", "0"], "--bench-duration 0.0: seconds > 0"),
])
def test_bad_bench_rate_is_refused_naming_the_flag(runtime: str, argv: list[str], message: str,
                                                   capsys: pytest.CaptureFixture) -> None:
    assert main(["--runtime", runtime, "--model", "orpheus-tiny", "--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_unwritable_bench_json_is_refused_before_the_run(runtime: str, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    proc = _bench(runtime, tmp_path, "--bench-json", str(tmp_path / "file" / "run.json"))
    assert proc.returncode == 2
    assert f"vox-serve: error: --bench-json {tmp_path / 'file' / 'run.json'}: " in proc.stderr
    assert "Traceback" not in proc.stderr and "phase 0" not in proc.stdout

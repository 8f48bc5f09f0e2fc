"""Several replicas in the Rust runtime's bench mode, on CPU: `--dp-size 2` builds two engines with a scheduler
thread each and sends every request to the least-loaded one; `--codec-gpu G` splits each replica into an LM half
and a codec half, the codec halves taking turns on one shared codec lane (rust/src/driver/codec_lane.rs; on a
CPU the "GPU" is the CPU). The audio is byte-identical to one replica serving the same requests one at a time
(each replica then runs one request, as the serial run does). What the lane and the router decide is tested in
the crate (`cargo test`: codec_lane, serve::bench_tests); the flags' rules here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rust_helpers import require_rt

from vox_serve.cli import RS, CliError, build_config, check_flags, given_flags
from vox_serve.config import EngineConfig, ModelConfig, ServerConfig, VoxConfig
from vox_serve.engine.placement import codec_device, replica_config

REPO = Path(__file__).resolve().parents[1]
KWARGS = json.dumps({"max_tokens": 28, "ignore_eos": True})


def _bench(out: Path, model: str, *extra: str) -> tuple[dict[str, bytes], dict, str]:
    """(WAVs by name, the --bench-json report, stdout and stderr) of a greedy Rust bench run of two requests."""
    report = out / "bench.json"
    cmd = [sys.executable, "-m", "vox_serve.launch", "--runtime", RS, "--model", model, "--device", "cpu",
           "--bench-requests", "2", "--greedy", "--bench-out", str(out), "--bench-kwargs", KWARGS,
           "--bench-json", str(report), *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    wavs = {f.name: f.read_bytes() for f in sorted(out.glob("*.wav"))}
    return wavs, json.loads(report.read_text()), proc.stdout + proc.stderr


@pytest.mark.parametrize("model", ["orpheus-tiny", "qwen3-tts-tiny"])
def test_two_replicas_and_a_shared_codec_lane_make_the_serial_audio(tmp_path: Path, model: str) -> None:
    require_rt()
    serial, _, _ = _bench(tmp_path / "serial", model, "--max-batch-size", "1", "--max-codec-batch", "1")
    assert list(serial) == ["bench-000.wav", "bench-001.wav"] and all(len(w) > 44 for w in serial.values())
    parallel, report, log = _bench(tmp_path / "dp", model, "--dp-size", "2")
    assert parallel == serial
    assert sorted(r["replica"] for r in report["phases"][0]["requests"]) == [0, 1]
    assert "replicas: 0: 1 requests, 1: 1 requests" in log
    shared, report, log = _bench(tmp_path / "lane", model, "--dp-size", "2", "--codec-gpu", "0")
    assert shared == serial
    assert sorted(r["replica"] for r in report["phases"][0]["requests"]) == [0, 1]
    assert log.count("(codec half)") == 2  # each replica's engine was split
    lane = [line for line in log.splitlines() if "shared codec lane served" in line]
    assert len(lane) == 1 and int(lane[0].split("served ")[1].split()[0]) > 0, log[-2000:]


def _rust_flags(*argv: str) -> dict:
    kept, _ = check_flags(given_flags(list(argv)), RS, rust_missing=False)
    return kept


def test_the_rust_runtime_takes_a_data_parallel_bench_and_a_codec_gpu() -> None:
    kept = _rust_flags("--dp-size", "3", "--codec-gpu", "3", "--bench-requests", "4")
    assert (kept["dp_size"], kept["codec_gpu"]) == (3, 3)
    kept = _rust_flags("--dp-size", "3", "--codec-gpu", "3", "--codec-sms", "24", "--bench-requests", "4")
    assert build_config(kept, RS).engine.codec_sms == 24


@pytest.mark.parametrize("argv,match", [
    (["--codec-gpu", "-1"], "a GPU index is >= 0"),
    (["--codec-gpu", "1", "--enable-disaggregation"], "use one of them"),
    (["--codec-gpu", "1", "--device", "cuda:0"], "replica i's LM runs on GPU i"),
    (["--codec-sms", "16"], "give it with --codec-gpu G"),
    (["--codec-gpu", "0", "--codec-sms", "0"], "at least one SM"),
    (["--codec-gpu", "0", "--codec-sms", "16", "--device", "cpu"], "--device cpu has none"),
])
def test_codec_gpu_flags_that_cannot_work_are_refused(argv: list[str], match: str) -> None:
    with pytest.raises(CliError, match=match):
        _rust_flags(*argv)


def test_the_python_runtime_has_no_codec_gpu_and_no_data_parallel_bench() -> None:
    with pytest.raises(CliError, match="--codec-gpu is not a flag of the python runtime"):
        check_flags(given_flags(["--codec-gpu", "1"]), "python", rust_missing=False)
    with pytest.raises(CliError, match="the Rust runtime runs a data-parallel bench"):
        check_flags(given_flags(["--dp-size", "2", "--bench-requests", "2"]), "python", rust_missing=False)


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def _config(dp_size: int, codec_gpu: int) -> VoxConfig:
    return VoxConfig(model=ModelConfig(device="auto"), server=ServerConfig(dp_size=dp_size),
                     engine=EngineConfig(codec_gpu=codec_gpu))


def test_with_a_codec_gpu_replica_i_runs_its_lm_on_gpu_i_and_every_codec_on_gpu_g(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 4)
    config = _config(3, 3)
    lms = [replica_config(config, i).model.device for i in range(3)]
    assert lms == ["cuda:0", "cuda:1", "cuda:2"]
    assert {codec_device(lm, config) for lm in lms} == {"cuda:3"}
    assert codec_device("cpu", config) == "cpu"


def test_a_codec_gpu_past_the_visible_ones_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 3)
    with pytest.raises(RuntimeError, match=r"--dp-size 3 needs 4 GPUs \(LM GPUs 0..2 and codec GPU 3: --codec-gpu\)"):
        replica_config(_config(3, 3), 0)

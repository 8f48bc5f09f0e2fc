"""Several GPUs (marker `gpu`, skipped unless 2 or more are visible): a disaggregated engine (LM on cuda:0, codec
on cuda:1, CUDA graphs, the hand-over a peer copy on the codec stream) makes byte-identical audio to the whole
engine on cuda:0, synchronous and with asynchronous scheduling, and in the Rust runtime's bench mode (its WAVs
equal to its whole engine's and to the Python runtime's); --dp-size 2 serves on cuda:0 and cuda:1."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from http_harness import generate_concurrently, parse_wav, running_server, wait_until
from rust_helpers import cuda_bench_wavs, require_rt

from tests.engine_helpers import make_loop, prepare
from tests.orpheus_helpers import run_requests
from vox_serve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.engine.build import load_program
from vox_serve.engine.registry import get_engine

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]


def _config(model: str, disaggregated: bool, async_scheduling: bool = False) -> VoxConfig:
    return VoxConfig(model=ModelConfig(model=model, device="cuda", load_format="dummy"),
                     cache=CacheConfig(max_num_pages=512, max_model_len=512),
                     scheduler=SchedulerConfig(max_batch_size=8, max_codec_batch=8, max_prefill_tokens=256,
                                               async_scheduling=async_scheduling),
                     engine=EngineConfig(enable_disaggregation=disaggregated))


def _audio(config: VoxConfig, n: int = 3) -> tuple[list[bytes], object]:
    program = load_program(config)
    if not config.engine.enable_disaggregation:
        prepare(program, config)
    loop = make_loop(program, config, disaggregated=config.engine.enable_disaggregation)
    fields = [{"text": f"Request number {i}, on two GPUs.", "max_tokens": 70, "ignore_eos": True} for i in range(n)]
    reqs = run_requests(program, config, fields, loop=loop)
    return [b"".join(r.extra["chunks"]) for r in reqs], loop.worker


@pytest.mark.parametrize("model", ["orpheus-tiny", "qwen3-tts-tiny", "csm-tiny"])
def test_disaggregated_on_two_gpus_equals_one_gpu(model: str) -> None:
    whole, _ = _audio(_config(model, disaggregated=False))
    split, worker = _audio(_config(model, disaggregated=True))
    lm, codec = (get_engine(w.spec["engine_id"]).program for w in (worker.lm, worker.codec))
    assert lm.state.codes.device.index in (None, 0) and codec.state.codes.device == torch.device("cuda:1")
    assert all(p.device == torch.device("cuda:1") for m in codec.codec_modules() for p in m.parameters())
    assert worker.lm.spec["stages"]["decode"]["graphs"] and worker.codec.spec["stages"]["codec"]["graphs"]
    assert all(len(pcm) > 0 for pcm in whole) and split == whole
    asynchronous, _ = _audio(_config(model, disaggregated=True, async_scheduling=True))
    assert asynchronous == whole


def _bench_wavs(runtime: str, out: Path, model: str, *extra: str) -> dict[str, bytes]:
    return cuda_bench_wavs(runtime, out, model, *extra)[0]


@pytest.mark.parametrize("model,extra", [
    ("orpheus-tiny", ()), ("qwen3-tts-tiny", ()), ("csm-tiny", ()),
    ("orpheus-tiny", ("--disable-cuda-graph",)),  # eager stages: callables on each half's stream
], ids=["orpheus", "qwen3", "csm", "orpheus-eager"])
def test_rust_disaggregated_on_two_gpus_equals_one_gpu(tmp_path: Path, model: str, extra: tuple[str, ...]) -> None:
    """The Rust driver: the LM half's graphs on cuda:0, the codec half's on cuda:1, the hand-over a peer copy on
    the codec stream between events; the trace shows both halves' launches, timed by CUDA events."""
    require_rt()
    reference = _bench_wavs("python", tmp_path / "py", model, *extra)
    assert list(reference) == ["bench-000.wav", "bench-001.wav", "bench-002.wav"]
    assert _bench_wavs("rust", tmp_path / "whole", model, *extra) == reference
    trace = tmp_path / "trace"
    split = _bench_wavs("rust", tmp_path / "split", model, *extra, "--enable-disaggregation", "--trace-dir", str(trace))
    assert split == reference
    (path,) = trace.glob("*.jsonl")
    stages = [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == "stage"]
    names = {s["stage"] for s in stages}
    assert {"handover", "codec_prologue", "codec", "decode"} <= names, names
    assert all(s["timer"] == "cuda" and s["device_ms"] > 0 for s in stages)


def test_dp2_serves_on_two_gpus(tmp_path: Path) -> None:
    with running_server(tmp_path, "--device", "auto", "--dp-size", "2", "--greedy") as server:
        assert [r["device"] for r in server.replicas()] == ["cuda:0", "cuda:1"]
        fields = {"text": "Two GPUs.", "max_tokens": 35, "seed": 3, "ignore_eos": True}
        responses = generate_concurrently(server, [dict(fields) for _ in range(8)])
        assert [r.status_code for r in responses] == [200] * 8
        assert set(Counter(int(r.headers["x-replica"]) for r in responses)) == {0, 1}
        assert len({len(parse_wav(r.content).pcm) for r in responses}) == 1  # 35 tokens of audio each
        wait_until(server.pools_full, 10.0)



def _two_requests(out: Path, *extra: str) -> dict[str, bytes]:
    """The WAVs of two greedy Rust bench requests (orpheus-tiny, CUDA graphs)."""
    return cuda_bench_wavs("rust", out, "orpheus-tiny", *extra, requests=2)[0]


@pytest.mark.parametrize("extra", [("--dp-size", "2"), ("--dp-size", "2", "--codec-gpu", "1"),
                                   ("--dp-size", "2", "--codec-gpu", "1", "--codec-sms", "32")],
                         ids=["dp2", "dp2-codec-gpu1", "dp2-codec-gpu1-sms32"])
def test_rust_replicas_on_two_gpus_make_the_serial_audio(tmp_path: Path, extra: tuple[str, ...]) -> None:
    """Replica 0 on cuda:0 and replica 1 on cuda:1, each running one of the two requests (with --codec-gpu 1 both
    codec halves on cuda:1, taking turns on the lane; with --codec-sms on one 32-SM partition of it): the audio
    of one GPU running them one at a time."""
    require_rt()
    serial = _two_requests(tmp_path / "serial", "--max-batch-size", "1", "--max-codec-batch", "1")
    assert list(serial) == ["bench-000.wav", "bench-001.wav"]
    assert _two_requests(tmp_path / "replicas", *extra) == serial

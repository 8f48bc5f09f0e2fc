"""GPU tier for Zonos (marker `gpu`, skipped without CUDA): its step rules and the DAC window decode
replay as CUDA graphs with the eager results, and the eager generation on CUDA equals the fixtures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from dac_helpers import save, tiny_reference
from safetensors.torch import load_file
from zonos_helpers import FIXTURES, generate, needs_espeak, scenario_sampling

from tests.engine_helpers import build_program, make_loop
from vox_serve.codecs.dac.decoder import load_dac, receptive_field
from vox_serve.codecs.dac.stream import decode_windows
from vox_serve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.models.zonos import delay, sampling
from vox_serve.models.zonos.loader import load_zonos_lm
from vox_serve.request_builder import build_request
from vox_serve.rt.attention import flashinfer_available

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def capture(fn: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn()
    return graph, out


def test_step_rules_replay_equal_eager() -> None:
    """Guidance, EOS ban, penalty, sampling (greedy and drawn rows), stop rule and column write in one graph."""
    n, gen = 4, torch.Generator(device=DEV).manual_seed(0)
    cond = torch.randn(n, 9, 1025, device=DEV, generator=gen)
    uncond = torch.randn(n, 9, 1025, device=DEV, generator=gen)
    history = torch.randint(0, 1026, (n, 9, 2), device=DEV, generator=gen)
    scale = torch.tensor([2.0, 3.0, 1.5, 2.0], device=DEV)
    params = sampling.ZonosSampling.filled(n, device=DEV, seed=3)
    params.temperature[0] = 0.0
    params.top_k[2] = 5
    remaining = torch.tensor([30, 5, 9, 2], device=DEV)
    stopping = torch.tensor([False, False, True, True], device=DEV)
    column = torch.tensor([12, 40, 7, 3], device=DEV)
    known = torch.full((n, 9), 1025, device=DEV)

    def step() -> torch.Tensor:
        logits = sampling.ban_eos_after_head0(sampling.guided_logits(cond, uncond, scale, 1026))
        logits = sampling.repetition_penalty(logits, history, params.repetition_penalty)
        tokens, left, stop = delay.stop_rule(sampling.sample_codes(logits, params), remaining, stopping)
        unknown = delay.unknown_entries(column, torch.zeros_like(column), torch.full_like(column, 35))
        return torch.cat([delay.write_column(tokens, known, unknown), left[:, None], stop[:, None].long()], dim=1)

    graph, out = capture(step)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, step())
        cond.copy_(torch.randn(n, 9, 1025, device=DEV, generator=gen))
        params.offset += 1


def test_dac_windows_replay_equal_eager(tmp_path) -> None:
    decoder = load_dac(save(tiny_reference(), tmp_path / "dac", "fused"), DEV, torch.float32)
    before, after = receptive_field(decoder.cfg)
    size = before + 4 + after
    codes = torch.randint(0, 1024, (3, 9, size), device=DEV)
    valid = torch.tensor([[0, size], [before, size], [0, before + 2]], device=DEV)
    graph, out = capture(lambda: decode_windows(decoder, codes, valid, before, 4))
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.allclose(out, decode_windows(decoder, codes, valid, before, 4), atol=1e-6)
        codes.random_(0, 1024)
        valid[2, 1] = size


def test_generation_on_cuda_matches_fixture() -> None:
    lm = load_zonos_lm(FIXTURES / "checkpoint", DEV, torch.float32)
    expected = load_file(FIXTURES / "expected_generation.safetensors")
    spec = json.loads((FIXTURES / "scenarios.json").read_text())["greedy"]
    params, window = scenario_sampling(spec)
    params = sampling.ZonosSampling(**{k: v.to(DEV) for k, v in vars(params).items()})
    out = generate(lm, expected["greedy.conditioning"].to(DEV), max_new_tokens=spec["generate"]["max_new_tokens"],
                   cfg_scale=spec["generate"]["cfg_scale"], params=params, repetition_window=window)
    assert torch.equal(out.codes.cpu(), expected["greedy.codes"])


# ---- the served program (paired rows through the engine) ----------------------------------------------

def test_served_fixture_graphs_equal_eager_and_upstream() -> None:
    """The fixture checkpoint in float32 with the torch backend: captured decode replays the eager steps, and
    both give upstream's codes; streamed PCM agrees within int16 rounding."""
    from zonos_serving_helpers import (
        SERVED,
        codes_of,
        config,
        expected,
        fixture_program,
        pcm_of,
        scenario_request,
        serve,
    )


    fx, runs = expected(), {}
    for graphs in (False, True):
        cfg = config("cuda", EngineConfig(attention_backend="torch", disable_cuda_graph=not graphs))
        reqs = serve(fixture_program(cfg), cfg, [scenario_request(n, fx[f"{n}.conditioning"]) for n in SERVED])
        for req in reqs:
            assert req.error is None and torch.equal(codes_of(req), fx[f"{req.req_id}.codes"][0]), req.req_id
        runs[graphs] = reqs
    for a, b in zip(runs[False], runs[True], strict=True):
        assert a.tokens == b.tokens and abs(pcm_of(a) - pcm_of(b)).max() <= 2


@pytest.mark.parametrize("backend,dtype", [("torch", "float32"), ("flashinfer", "bfloat16")])
def test_zonos_tiny_graphs_equal_eager(backend: str, dtype: str) -> None:
    """zonos-tiny (head_dim 64) from the registry: graphs == eager tokens with each attention backend
    (FlashInfer plans 2 * bucket attention rows; it needs a 16-bit type)."""
    from vox_serve.config import EngineConfig

    if backend == "flashinfer" and not flashinfer_available():
        pytest.skip("flashinfer not installed")
    needs_espeak()  # text prompts
    tokens = {}
    for graphs in (False, True):
        cfg = VoxConfig(model=ModelConfig(model="zonos-tiny", device="cuda", dtype=dtype),
                        cache=CacheConfig(max_num_pages=512, max_model_len=512),
                        scheduler=SchedulerConfig(max_batch_size=8, max_codec_batch=8, max_prefill_tokens=256),
                        engine=EngineConfig(attention_backend=backend, disable_cuda_graph=not graphs))
        program = build_program(cfg)
        loop = make_loop(program, cfg)
        reqs = [build_request(program.meta, program.preprocess, {"text": f"Request {i}, some text.", "max_tokens": 48,
                                                                  "ignore_eos": True, "cfg_scale": 1.5 + i},
                              f"r{i}", greedy=True, seed=i) for i in range(3)]
        for req in reqs:
            loop.scheduler.add_request(req)
        loop.run_until_idle()
        assert all(r.error is None and len(r.tokens) == 48 for r in reqs)
        tokens[graphs] = [r.tokens for r in reqs]
    assert tokens[True] == tokens[False]


def test_zonos_full_size_dummy_loads_and_serves() -> None:
    """The published size (26 layers, d_model 2048) with dummy weights in bf16, DAC 44.1 kHz at full size."""
    needs_espeak()  # bench mode's text
    cmd = [sys.executable, "-m", "vox_serve.launch", "--model", "zonos", "--load-format", "dummy",
           "--device", "cuda", "--bench-requests", "2", "--max-model-len", "512", "--max-batch-size", "8",
           "--bench-kwargs", '{"max_tokens": 60, "ignore_eos": true}']
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights_mib = float(re.search(r"weights (\d+) MiB", proc.stderr).group(1))
    assert 2800 < weights_mib < 4200, weights_mib  # ~1.6B bf16 LM parameters + DAC
    assert proc.stdout.count(" length") == 2

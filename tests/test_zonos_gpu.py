"""GPU tier for Zonos (marker `gpu`, skipped without CUDA): its step rules and the DAC window decode
replay as CUDA graphs with the eager results, and the eager generation on CUDA equals the fixtures."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from dac_helpers import save, tiny_reference
from safetensors.torch import load_file
from zonos_helpers import FIXTURES, generate, scenario_sampling

from vox_serve.codecs.dac.decoder import load_dac, receptive_field
from vox_serve.codecs.dac.stream import decode_windows
from vox_serve.models.zonos import delay, sampling
from vox_serve.models.zonos.loader import load_zonos_lm

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

"""Zonos served through the real scheduler and the spec-driven worker on CPU, against upstream's fixtures
and the eager reference loop (tests/zonos_helpers.py): paired CFG rows, the delay pattern, the stop diagonal,
the frames that reach the codec, and DAC's windowed streaming against a one-shot decode.

Tolerances: codes and delayed columns are compared exactly (float32; greedy and top-k 1 choices are
insensitive to summation order at these margins). Streamed PCM equals the one-shot decode of the same
codes within 2 int16 steps (DAC windows of 10 frames each side: float rounding only).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.zonos_helpers import generate
from tests.zonos_serving_helpers import (
    SCENARIOS,
    SERVED,
    codes_of,
    config,
    expected,
    fixture_program,
    one_shot_pcm,
    pcm_of,
    scenario_request,
    serve,
)
from vox_serve.config import CacheConfig
from vox_serve.core.request import Request, SamplingParams
from vox_serve.models.zonos import sampling
from vox_serve.models.zonos.prompt import DELAY_STEPS, prefix_prompt
from vox_serve.scheduler.base import Scheduler

PCM_TOL = 2.0


@pytest.fixture(scope="module")
def fixtures() -> dict[str, torch.Tensor]:
    return expected()


def _check_fixtures(reqs: list[Request], fx: dict[str, torch.Tensor]) -> None:
    for req in reqs:
        name = req.req_id.split("#")[0]
        assert req.error is None
        assert torch.equal(codes_of(req), fx[f"{name}.codes"][0]), name
        columns = torch.tensor(req.tokens).T  # token row g = delayed column g + 1
        assert torch.equal(columns, fx[f"{name}.delayed_codes"][0, :, 1 : 1 + columns.shape[1]]), name
    by_name = {r.req_id.split("#")[0]: r for r in reqs}
    assert by_name["greedy"].finish_reason == "stop"  # the EOS diagonal
    assert by_name["max_tokens"].finish_reason == "length"  # frames ran out: every frame kept


@pytest.mark.parametrize("policy", ["base", "online", "offline", "deadline"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_served_codes_equal_upstream(fixtures, policy: str, async_scheduling: bool) -> None:
    """All served scenarios at once (a batch of paired rows), every policy, synchronous and asynchronous."""
    cfg = config(scheduler_type=policy)
    program = fixture_program(cfg)
    reqs = [scenario_request(n, fixtures[f"{n}.conditioning"]) for n in SERVED]
    _check_fixtures(serve(program, cfg, reqs, async_scheduling=async_scheduling), fixtures)


def test_chunked_prefixes_and_preemption(fixtures, monkeypatch) -> None:
    """Prefixes longer than a prefill launch go in chunks; a KV cache too small for every request preempts
    and recomputes both streams from the history (the stop state stays in the slot)."""
    preempted = []
    preempt = Scheduler._preempt
    monkeypatch.setattr(Scheduler, "_preempt", lambda self, req: (preempted.append(req.req_id), preempt(self, req)))
    cfg = config(max_prefill_tokens=8, cache=CacheConfig(page_size=4, max_num_pages=40))
    program = fixture_program(cfg)
    reqs = [scenario_request(n, fixtures[f"{n}.conditioning"], f"{n}#{i}") for i in range(2) for n in SERVED]
    _check_fixtures(serve(program, cfg, reqs), fixtures)
    assert preempted


def test_sampled_rows_equal_the_reference_loop(fixtures) -> None:
    """Top-k 1 and a min-p draw with the request's seed: the engine's draws equal the eager loop's (same
    uniforms at offset g), with a guidance scale and penalty window of its own per request."""
    cond = fixtures["greedy.conditioning"]
    cfg = config()
    program = fixture_program(cfg)
    cases = {"topk1": dict(temperature=1.0, top_k=1, cfg_scale=3.0, window=3),
             "minp": dict(temperature=1.0, min_p=0.1, cfg_scale=2.0, window=2)}
    reqs = []
    for name, c in cases.items():
        s = SamplingParams(temperature=c["temperature"], top_k=c.get("top_k", 0), min_p=c.get("min_p", 0.0),
                           repetition_penalty=3.0, repetition_window=c["window"], max_tokens=30 + DELAY_STEPS, seed=11)
        reqs.append(Request(name, prefix_prompt(cond, cfg_scale=c["cfg_scale"], num_frames=30), s))
    serve(program, cfg, reqs)
    for req, c in zip(reqs, cases.values(), strict=True):
        params = sampling.ZonosSampling.filled(1, seed=11, temperature=c["temperature"], top_k=c.get("top_k", 0),
                                               min_p=c.get("min_p", 0.0), top_p=0.0)
        ref = generate(program.lm, cond, max_new_tokens=30, cfg_scale=c["cfg_scale"], params=params,
                       repetition_window=c["window"])
        assert req.error is None and torch.equal(codes_of(req), ref.codes[0]), req.req_id


@pytest.mark.parametrize("first_chunk_frames", [None, 2])
def test_streamed_audio_equals_one_shot_decode(fixtures, first_chunk_frames: int | None) -> None:
    """Chunks of 4 frames (first ones of 2) through DAC windows join to the one-shot decode of all frames."""
    cfg = config(first_chunk_frames=first_chunk_frames)
    program = fixture_program(cfg)
    reqs = serve(program, cfg, [scenario_request(n, fixtures[f"{n}.conditioning"]) for n in SERVED])
    for req in reqs:
        want = one_shot_pcm(program, fixtures[f"{req.req_id}.codes"][0])
        got = pcm_of(req)
        assert got.shape == want.shape and np.abs(want).max() > 0
        assert np.abs(got - want).max() <= PCM_TOL, req.req_id


def test_ignore_eos_runs_to_max_tokens(fixtures) -> None:
    """ignore_eos: codebook 0 may not sample EOS, so the greedy scenario makes every frame it may."""
    cfg = config()
    program = fixture_program(cfg)
    req = scenario_request("greedy", fixtures["greedy.conditioning"])
    req.sampling = dataclasses.replace(req.sampling, ignore_eos=True)
    serve(program, cfg, [req])
    frames = SCENARIOS["greedy"]["generate"]["max_new_tokens"]
    assert req.finish_reason == "length" and codes_of(req).shape == (9, frames)
    assert torch.equal(codes_of(req)[:, :20], fixtures["greedy.codes"][0, :, :20])  # same until EOS mattered

"""Program-declared fields end to end on CPU: several input columns, prompt vectors (several per
sequence), a per-slot conditioning field set at admission and read by the LM and the codec, and a
float latent per frame handed from the LM rows to the codec windows -- through the real scheduler,
the spec-driven worker and the engine, against a whole-sequence recomputation of the same model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.declared_program import COND_ROWS, DIM, DeclaredProgram, frame_value, reference_generate
from tests.engine_helpers import make_loop, prepare
from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.core.chunks import ChunkGeometry
from vox_serve.core.request import Prompt, Request, SamplingParams

STEPS = 12
CONFIG = VoxConfig(model=ModelConfig(model="declared", device="cpu"), cache=CacheConfig(max_num_pages=64),
                   scheduler=SchedulerConfig(max_batch_size=4, max_prefill_tokens=64, max_codec_batch=4))


def _prompts() -> list[Prompt]:
    g = np.random.default_rng(3)
    ids = lambda n: np.stack([g.integers(0, 32, n), np.full(n, -1), g.integers(0, 32, n)], axis=1)  # noqa: E731
    vec = lambda: g.standard_normal(DIM).astype(np.float32)  # noqa: E731
    cond = lambda rows: g.standard_normal((rows, DIM)).astype(np.float32)  # noqa: E731
    same_ids = ids(6)
    return [
        Prompt.of(ids(5), {0: vec(), 3: vec()}, {"cond": cond(2)}),  # two prompt vectors in one sequence
        Prompt.of(same_ids, {1: vec()}, {"cond": cond(COND_ROWS)}),
        Prompt.of(same_ids, {1: vec()}, {"cond": cond(1)}),  # same ids, another vector and conditioning
    ]


def _expected_pcm(program: DeclaredProgram, prompt: Prompt, codes: list[list[int]], latents: torch.Tensor) -> bytes:
    meta = program.meta
    geo = ChunkGeometry.from_meta(meta, meta.frames_per_chunk)
    cond = torch.as_tensor(prompt.conditioning["cond"])
    cond_term = cond.mean(0).mean()
    frames = torch.tensor(codes)
    out, index = [], 0
    while (w := geo.chunk(index, len(codes), final=True)) is not None:
        f = (w.first_frame + torch.arange(geo.window)).clamp(min=0).clamp(max=w.window_end - 1)
        value = frame_value(frames[f][None], latents[f][None], cond_term[None])[0]
        emitted = value[geo.lookback : geo.lookback + w.num_frames].repeat_interleave(meta.samples_per_frame)
        out.append((emitted.clamp(-1, 1) * 32767).round().to(torch.int16).numpy().tobytes())
        index += 1
    return b"".join(out)


@pytest.mark.parametrize("async_scheduling,disaggregated", [(False, False), (True, False), (False, True), (True, True)])
def test_declared_fields_flow_through_the_engine(async_scheduling: bool, disaggregated: bool) -> None:
    """Also disaggregated: the latents reach the codec half through the hand-over, the conditioning through
    its own copy of the admissions."""
    program = DeclaredProgram() if disaggregated else prepare(DeclaredProgram(), CONFIG)
    loop = make_loop(program, CONFIG, async_scheduling=async_scheduling, disaggregated=disaggregated)
    reqs = []
    for i, prompt in enumerate(_prompts()):
        req = Request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
        req.extra["pcm"] = []
        req.sink = lambda r, pcm, final: pcm and r.extra["pcm"].append(pcm)
        loop.scheduler.add_request(req)
        reqs.append(req)
    loop.run_until_idle()
    for req in reqs:
        assert req.error is None and req.finish_reason == "length"
        tokens, latents = reference_generate(program, req.prompt, STEPS)
        assert req.tokens == tokens  # several input columns: each frame's codes feed the next position
        assert req.codes == sum(tokens, [])
        got = np.frombuffer(b"".join(req.extra["pcm"]), dtype=np.int16).astype(np.int32)
        want = np.frombuffer(_expected_pcm(program, req.prompt, tokens, latents), dtype=np.int16).astype(np.int32)
        assert got.size == want.size > 0 and np.abs(got - want).max() <= 1  # latents and conditioning reached the codec
    assert reqs[1].tokens != reqs[2].tokens  # same ids: the vectors and the slot's conditioning decide

"""Paired rows (`ProgramLayout.kv_streams = 2`, classifier-free guidance) through the engine contract on
CPU: two KV sequences per request with their own pages and prompt vectors, attended stream by stream,
their logits mixed with each request's `cfg_scale` -- through the real scheduler (every policy,
asynchronous scheduling, chunked prompts, preemption and recomputation) and the spec-driven worker,
against a whole-sequence recomputation of both streams."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.engine_helpers import make_loop, prepare, spec_of
from tests.paired_program import PairedProgram, paired_prompt, reference_generate
from vox_serve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.core.page_pool import OutOfPages, PagePool
from vox_serve.core.request import Request, SamplingParams
from vox_serve.rt.attention import flashinfer_available
from vox_serve.scheduler.base import Scheduler

STEPS = 10
PAGE = 4
CONFIG = VoxConfig(model=ModelConfig(model="paired", device="cpu"), cache=CacheConfig(page_size=PAGE, max_num_pages=64),
                   scheduler=SchedulerConfig(max_batch_size=4, max_prefill_tokens=64, max_codec_batch=4))


def _prompts(dim: int) -> list:
    g = np.random.default_rng(5)
    ids = lambda n: np.stack([g.integers(0, 24, n), g.integers(-1, 24, n)], axis=1)  # noqa: E731
    vec = lambda: g.standard_normal(dim).astype(np.float32).tolist()  # noqa: E731
    same = ids(7)
    return [
        paired_prompt(ids(9), {0: vec(), 5: vec()}, {0: vec(), 2: vec()}, cfg_scale=2.0),
        paired_prompt(same, {1: vec()}, {1: vec()}, cfg_scale=3.0),
        paired_prompt(same, {1: vec()}, {1: vec()}, cfg_scale=1.5),
        paired_prompt(ids(13), {12: vec()}, {}, cfg_scale=2.5),  # only the conditional stream has a vector
    ]


def _serve(config: VoxConfig, program: PairedProgram | None = None,
           **options: object) -> tuple[PairedProgram, list[Request]]:
    program = prepare(program or PairedProgram(), config)
    loop = make_loop(program, config, **options)
    reqs = []
    for i, prompt in enumerate(_prompts(program.dim)):
        req = Request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
        loop.scheduler.add_request(req)
        reqs.append(req)
    loop.run_until_idle()
    loop.scheduler.pool.check()
    assert loop.scheduler.pool.num_free == loop.scheduler.pool.num_usable
    return program, reqs


def _check(program: PairedProgram, reqs: list[Request]) -> None:
    for req in reqs:
        assert req.error is None and req.finish_reason == "length"
        assert req.tokens == reference_generate(program, req.prompt, STEPS)
    assert reqs[1].tokens != reqs[2].tokens  # same ids and vectors: the guidance scale decides


@pytest.mark.parametrize("policy", ["base", "online", "offline", "deadline"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_paired_rows_equal_the_reference(policy: str, async_scheduling: bool) -> None:
    config = dataclasses.replace(CONFIG, scheduler=dataclasses.replace(CONFIG.scheduler, scheduler_type=policy))
    _check(*_serve(config, async_scheduling=async_scheduling))


def test_chunked_prompts_and_preemption(monkeypatch) -> None:
    """Prompts longer than a prefill launch are computed in chunks (vectors in later chunks included), and a
    KV cache too small for all requests preempts them: each recomputes both streams from its history."""
    preempted = []
    preempt = Scheduler._preempt
    monkeypatch.setattr(Scheduler, "_preempt", lambda self, req: (preempted.append(req.req_id), preempt(self, req)))
    config = dataclasses.replace(CONFIG, cache=CacheConfig(page_size=PAGE, max_num_pages=16),
                                 scheduler=dataclasses.replace(CONFIG.scheduler, max_prefill_tokens=8))
    program, reqs = _serve(config)
    _check(program, reqs)
    assert preempted


def test_each_stream_has_its_own_pages() -> None:
    program = prepare(PairedProgram(), CONFIG)
    loop = make_loop(program, CONFIG)
    req = Request("r", _prompts(program.dim)[3], SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
    loop.scheduler.add_request(req)
    loop.step()
    pages = loop.scheduler.pool.pages("r")
    assert len(pages) == 2 * -(-(req.prompt_len + 1) // PAGE)  # both streams hold the prompt and one token
    row = program.state.page_table[req.slot].tolist()
    per_stream = program.limits.max_pages_per_seq
    blocks = len(pages) // 2
    assert row[:blocks] == pages[0::2] and row[per_stream : per_stream + blocks] == pages[1::2]
    spec = spec_of(program)
    assert spec["meta"]["layout"]["kv_streams"] == spec["limits"]["kv_streams"] == spec["attention"]["kv_streams"] == 2
    fields = {f["name"]: f["shape"] for f in spec["arenas"]["step_in"]["fields"]}
    b, s = CONFIG.scheduler.max_batch_size, program.limits.max_prefill_seqs
    assert fields["decode_kv_indptr"] == [2 * b + 1] and fields["prefill_qo_indptr"] == [2 * s + 1]
    assert fields["prefill_vec"] == [program.meta.layout.max_prompt_vectors, 2 * program.dim]


def test_page_pool_blocks_of_two_streams() -> None:
    """A block of page_size positions takes one page per stream; counts are pages."""
    pool = PagePool(num_pages=14, page_size=4, kv_streams=2)  # 13 usable
    assert pool.pages_needed("a", 9) == 6
    assert pool.reserve("a", 9) == [1, 2, 3, 4, 5, 6]  # block by block, stream 0 then stream 1
    assert pool.num_tokens_capacity("a") == 12 and pool.num_blocks("a") == 3
    assert pool.pages_needed("a", 12) == 0 and pool.pages_needed("a", 13) == 2
    assert pool.reserve("b", 1) == [7, 8]
    assert pool.extend_each(["a", "b"]) == [9, 10, 11, 12]
    assert pool.pages("a")[-2:] == [9, 10] and pool.pages("b") == [7, 8, 11, 12]
    assert pool.num_free == 1 and not pool.can_reserve("c", 1)
    with pytest.raises(OutOfPages):
        pool.reserve("c", 1)
    with pytest.raises(OutOfPages):
        pool.extend_each(["b"])
    pool.check()
    assert pool.free("a") == 8 and pool.num_free == 9
    pool.check()


@pytest.mark.gpu
@pytest.mark.parametrize("backend,dtype", [("torch", torch.float32), ("flashinfer", torch.bfloat16)])
def test_paired_rows_graphs_equal_eager_on_gpu(backend: str, dtype: torch.dtype) -> None:
    """Captured stages (decode and, with FlashInfer, prefill: 2 * bucket attention rows / tokens) give the
    eager tokens; in float32 both equal the reference. FlashInfer needs head_dim 64 and a 16-bit type."""
    if backend == "flashinfer" and not flashinfer_available():
        pytest.skip("flashinfer not installed")
    tokens = {}
    for graphs in (False, True):
        config = dataclasses.replace(CONFIG, model=ModelConfig(model="paired", device="cuda"),
                                     engine=EngineConfig(attention_backend=backend, disable_cuda_graph=not graphs))
        program, reqs = _serve(config, PairedProgram(head_dim=64, device="cuda", dtype=dtype))
        if dtype == torch.float32:
            _check(program, reqs)
        tokens[graphs] = [r.tokens for r in reqs]
        assert all(r.error is None and len(r.tokens) == STEPS for r in reqs)
    assert tokens[True] == tokens[False]

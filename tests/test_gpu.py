"""GPU tier (marker `gpu`, skipped without CUDA): graphs equal eager, FlashInfer equals the PyTorch
backend, and the full-size Orpheus model loads with dummy weights and serves."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from vox_serve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.engine.build import build_program
from vox_serve.engine_loop import EngineLoop
from vox_serve.request_builder import build_request
from vox_serve.rt.attention import (
    AttentionBuffers,
    AttentionPlan,
    flashinfer_available,
    make_attention_backend,
    paged_kv_csr,
)
from vox_serve.scheduler.base import Scheduler
from vox_serve.worker.program_worker import ProgramWorker

pytestmark = pytest.mark.gpu


def _run(config: VoxConfig, use_graphs: bool, n: int = 3, max_tokens: int = 70) -> list:
    program = build_program(config)
    loop = EngineLoop(Scheduler(program.meta, program.limits, config.scheduler),
                      ProgramWorker(program, use_cuda_graphs=use_graphs))
    reqs = []
    for i in range(n):
        req = build_request(program.meta, program.preprocess,
                            {"text": f"Request number {i}, with some text.", "max_tokens": max_tokens,
                             "ignore_eos": True}, f"r{i}", greedy=True, seed=i)
        req.extra["pcm"] = []
        req.sink = lambda r, pcm, final: pcm and r.extra["pcm"].append(pcm)
        loop.scheduler.add_request(req)
        reqs.append(req)
    loop.run_until_idle()
    return reqs


def _config(backend: str, dtype: str = "float32", model: str = "orpheus-tiny") -> VoxConfig:
    return VoxConfig(model=ModelConfig(model=model, device="cuda", dtype=dtype, load_format="dummy"),
                     cache=CacheConfig(max_num_pages=512, max_model_len=512),
                     scheduler=SchedulerConfig(max_batch_size=8, max_codec_batch=8, max_prefill_tokens=256),
                     engine=EngineConfig(attention_backend=backend))


@pytest.mark.parametrize("backend,dtype,model", [("torch", "float32", "orpheus-tiny"),
                                                ("flashinfer", "bfloat16", "orpheus")])
def test_graph_replay_equals_eager(backend: str, dtype: str, model: str) -> None:
    """FlashInfer needs head_dim 64/128/256 and 16-bit types: the full-size model with dummy weights."""
    if backend == "flashinfer" and not flashinfer_available():
        pytest.skip("flashinfer not installed")
    eager = _run(_config(backend, dtype, model), use_graphs=False)
    graphed = _run(_config(backend, dtype, model), use_graphs=True)
    for a, b in zip(eager, graphed, strict=True):
        assert a.error is None and b.error is None
        assert a.tokens == b.tokens
        pa = torch.frombuffer(bytearray(b"".join(a.extra["pcm"])), dtype=torch.int16).float()
        pb = torch.frombuffer(bytearray(b"".join(b.extra["pcm"])), dtype=torch.int16).float()
        assert pa.shape == pb.shape and pa.numel() > 0
        assert (pa - pb).abs().max().item() <= 2.0  # int16 steps: rounding of identical math


@pytest.mark.skipif(not flashinfer_available(), reason="flashinfer not installed")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flashinfer_equals_torch_backend(dtype: torch.dtype) -> None:
    """Mixed prefill (fresh and chunked) and decode batches with ragged lengths and scattered pages."""
    gen = torch.Generator().manual_seed(0)
    kw = dict(num_layers=1, num_pages=64, page_size=16, num_q_heads=24, num_kv_heads=8, head_dim=128,
              dtype=dtype, device="cuda")
    ref, fi = make_attention_backend("torch", **kw), make_attention_backend("flashinfer", **kw)
    init = torch.randn(ref.kv_caches[0].shape, generator=gen).to(dtype).cuda()
    ref.kv_caches[0].copy_(init)
    fi.kv_caches[0].copy_(init)
    perm = (torch.randperm(63, generator=gen) + 1).tolist()
    cases = [([5, 17, 1], [5, 40, 33]), ([1, 1, 1, 1], [1, 16, 17, 70])]
    for qo_lens, kv_lens in cases:
        pages, used = [], 0
        for kv in kv_lens:
            n = -(-kv // 16)
            pages.append(perm[used : used + n])
            used += n
        t = sum(qo_lens)
        slots = [pages[s][p // 16] * 16 + p % 16 for s, (q, kv) in enumerate(zip(qo_lens, kv_lens, strict=True))
                 for p in range(kv - q, kv)]
        table = torch.zeros(len(qo_lens), 8, dtype=torch.int32)
        for s, pg in enumerate(pages):
            table[s, : len(pg)] = torch.tensor(pg)
        indptr = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
        kv_indptr = torch.zeros(len(qo_lens) + 1, dtype=torch.int32).pin_memory()
        kv_indices = torch.zeros(table.numel(), dtype=torch.int32)
        last = torch.zeros(len(qo_lens), dtype=torch.int32).pin_memory()
        paged_kv_csr(table.numpy(), np.array(kv_lens), 16, kv_indptr.numpy(), kv_indices.numpy(), last.numpy())
        bufs = AttentionBuffers(table.cuda(), torch.tensor(kv_lens, dtype=torch.int32).cuda(), indptr.cuda(),
                                torch.tensor(slots).cuda(), kv_indices.cuda(), kv_indptr, last, indptr.pin_memory())
        plan = AttentionPlan(len(qo_lens), qo_lens, kv_lens, pages, len(qo_lens))
        q = torch.randn(t, 24, 128, generator=gen).to(dtype).cuda()
        k = torch.randn(t, 8, 128, generator=gen).to(dtype).cuda()
        v = torch.randn(t, 8, 128, generator=gen).to(dtype).cuda()
        outs = []
        for backend in (ref, fi):
            backend.plan(plan, bufs)
            outs.append(backend.forward(0, q, k, v, bufs).float())
        rel = (outs[0] - outs[1]).norm() / outs[0].norm()
        assert rel.item() < 2e-2
        assert torch.equal(ref.kv_caches[0], fi.kv_caches[0])


def test_orpheus_3b_dummy_loads_and_serves() -> None:
    cmd = [sys.executable, "-m", "vox_serve.launch", "--model", "orpheus", "--load-format", "dummy",
           "--device", "cuda", "--bench-requests", "2", "--max-model-len", "512", "--max-batch-size", "8",
           "--bench-kwargs", '{"max_tokens": 70, "ignore_eos": true}']
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights_mib = float(re.search(r"weights (\d+) MiB", proc.stderr).group(1))
    assert 5500 < weights_mib < 7500  # 3.3B bf16 parameters (LM) + SNAC
    assert proc.stdout.count(" length") == 2

"""GPU tier (marker `gpu`, skipped without CUDA): graphs equal eager (Orpheus; Qwen3-TTS with its code
predictor, codec slot pools, cloned-voice prompt vectors and first-chunk graphs), FlashInfer and the Triton
backend (its cache in bfloat16 or float8) equal the PyTorch backend, and the full-size Orpheus model loads
with dummy weights and serves; CSM (graphs == eager on csm-tiny, CSM-1B with dummy weights serves)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.engine_helpers import build_program, make_loop
from tests.qwen3_tts_helpers import reference_wavs
from vox_serve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.request_builder import build_request
from vox_serve.rt.attention import (
    AttentionBuffers,
    AttentionPlan,
    PlanInputs,
    flashinfer_available,
    make_attention_backend,
    paged_kv_offsets,
)
from vox_serve.rt.lm_batch import _kv_indices

pytestmark = pytest.mark.gpu


def _run(config: VoxConfig, use_graphs: bool, n: int = 3, max_tokens: int = 70, fields: dict | None = None) -> list:
    config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, disable_cuda_graph=not use_graphs))
    program = build_program(config)
    loop = make_loop(program, config)
    reqs = []
    for i in range(n):
        req_fields = {"text": f"Request number {i}, with some text.", "max_tokens": max_tokens, "ignore_eos": True,
                      **(fields or {})}
        req = build_request(program.meta, program.preprocess, req_fields, f"r{i}", greedy=True, seed=i)
        req.extra["pcm"] = []
        req.sink = lambda r, pcm, final: pcm and r.extra["pcm"].append(pcm)
        loop.scheduler.add_request(req)
        reqs.append(req)
    loop.run_until_idle()
    return reqs


def _config(backend: str, dtype: str = "float32", model: str = "orpheus-tiny", kv_cache_dtype: str = "auto",
            quantization: str = "none", **scheduler: object) -> VoxConfig:
    return VoxConfig(model=ModelConfig(model=model, device="cuda", dtype=dtype, load_format="dummy",
                                       quantization=quantization),
                     cache=CacheConfig(max_num_pages=512, max_model_len=512, kv_cache_dtype=kv_cache_dtype),
                     scheduler=SchedulerConfig(max_batch_size=8, max_codec_batch=8, max_prefill_tokens=256,
                                               **scheduler),
                     engine=EngineConfig(attention_backend=backend))


def _assert_same(eager: list, graphed: list, pcm_tol: float) -> None:
    for a, b in zip(eager, graphed, strict=True):
        assert a.error is None and b.error is None
        assert a.tokens == b.tokens
        pa = torch.frombuffer(bytearray(b"".join(a.extra["pcm"])), dtype=torch.int16).float()
        pb = torch.frombuffer(bytearray(b"".join(b.extra["pcm"])), dtype=torch.int16).float()
        assert pa.shape == pb.shape and pa.numel() > 0
        assert (pa - pb).abs().max().item() <= pcm_tol


@pytest.mark.parametrize("backend,dtype,model,kv", [("torch", "float32", "orpheus-tiny", "auto"),
                                                   ("flashinfer", "bfloat16", "orpheus", "auto"),
                                                   ("triton", "bfloat16", "orpheus", "auto"),
                                                   ("triton", "bfloat16", "orpheus", "fp8"),
                                                   ("flashinfer", "bfloat16", "orpheus", "fp8")])
def test_graph_replay_equals_eager(backend: str, dtype: str, model: str, kv: str) -> None:
    """FlashInfer needs head_dim 64/128/256 and 16-bit types: the full-size model with dummy weights (the Triton
    backend too: its prefill is captured; both with a float8 KV cache)."""
    if backend == "flashinfer" and not flashinfer_available():
        pytest.skip("flashinfer not installed")
    eager = _run(_config(backend, dtype, model, kv), use_graphs=False)
    graphed = _run(_config(backend, dtype, model, kv), use_graphs=True)
    _assert_same(eager, graphed, pcm_tol=2.0)  # int16 steps: rounding of identical math


def test_graph_replay_equals_eager_with_float8_weights() -> None:
    """`--quantization fp8`: the small-rows kernels with scales, the rows' quantization and the float8 GEMMs
    captured (prefill and 4-row decode). Orpheus only: full-size Qwen3-TTS with dummy weights does not keep its
    greedy codes between eager and captured steps even in bfloat16 (near-tied logits; on an H100 one of three
    requests diverged, benchmark/results/h100-2026-12-07d), so its float8 run is compared with the Rust runtime's
    instead (tests/test_rust_runtime.py, `qwen3-w8`)."""
    if not flashinfer_available():
        pytest.skip("flashinfer not installed")
    eager = _run(_config("flashinfer", "bfloat16", "orpheus", quantization="fp8"), use_graphs=False)
    graphed = _run(_config("flashinfer", "bfloat16", "orpheus", quantization="fp8"), use_graphs=True)
    _assert_same(eager, graphed, pcm_tol=2.0)


@pytest.mark.parametrize("model,fields", [("qwen3-tts-tiny", {}),
                                          ("qwen3-tts-tiny", {"non_streaming_mode": False}),
                                          ("qwen3-tts-base-tiny", {"x_vector_only_mode": True}),
                                          ("qwen3-tts-base-tiny", {"ref_text": "A reference sentence."}),
                                          ("qwen3-tts-base-tiny", {"ref_text": "A reference sentence.",
                                                                   "non_streaming_mode": True})])
def test_qwen3_graph_replay_equals_eager(model: str, fields: dict) -> None:
    """The talker, the code predictor's 15 sub-steps and the codec's slot pools inside the graphs, with a
    smaller first chunk (its own graphs); Base adds the speaker embedding as a prompt vector, and in context
    the `codec_prime` stage (the reference frames primed into the codec slots at admission)."""
    if model.startswith("qwen3-tts-base"):
        fields = {**fields, "audio": reference_wavs()["sine"]}
    kw = {"first_chunk_frames": 2, "detokenize_interval": 4}
    eager = _run(_config("torch", "float32", model, **kw), use_graphs=False, max_tokens=23, fields=fields)
    graphed = _run(_config("torch", "float32", model, **kw), use_graphs=True, max_tokens=23, fields=fields)
    _assert_same(eager, graphed, pcm_tol=2.0)


def test_csm_graph_replay_equals_eager() -> None:
    """CSM: the backbone, the depth decoder's 31 sub-steps over its static KV and Mimi's slot pools inside the
    graphs, a first chunk of 2 frames, an integer speaker and a context turn given as codes."""
    codes = [[(5 * f + 3 * k) % 2048 for k in range(32)] for f in range(3)]
    fields = {"speaker": 1, "context": [{"text": "Before.", "speaker": 0, "codes": codes}]}
    kw = {"first_chunk_frames": 2, "detokenize_interval": 4}
    eager = _run(_config("torch", "float32", "csm-tiny", **kw), use_graphs=False, max_tokens=11, fields=fields)
    graphed = _run(_config("torch", "float32", "csm-tiny", **kw), use_graphs=True, max_tokens=11, fields=fields)
    _assert_same(eager, graphed, pcm_tol=2.0)


@pytest.mark.skipif(not flashinfer_available(), reason="flashinfer not installed")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flashinfer_equals_torch_backend(dtype: torch.dtype) -> None:
    """Mixed prefill (fresh and chunked) and decode batches with ragged lengths and scattered pages; at 16 query
    heads over 8 (FlashInfer's CUDA-core decode) the 1- and 2-row decode launches run rt/attention/triton_decode's
    kernel, at 24 over 8 FlashInfer's tensor-core decode."""
    for q_heads in (24, 16):
        _backend_against_torch("flashinfer", dtype, q_heads)


@pytest.mark.skipif(not flashinfer_available(), reason="flashinfer not installed")
def test_flashinfer_reads_a_float8_cache_as_the_torch_backend_does() -> None:
    """The same batches through FlashInfer's e4m3 modules (tensor-core and CUDA-core decode, fa2 prefill) and the
    buckets its backend serves with the Triton kernel, over a float8 cache."""
    for q_heads in (24, 16):
        _backend_against_torch("flashinfer", torch.bfloat16, q_heads, torch.float8_e4m3fn)


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["model-dtype", "fp8"])
def test_triton_backend_equals_torch_backend(kv_dtype: torch.dtype | None) -> None:
    """The same batches through the planless Triton backend, its cache in bfloat16 or float8 (the reference reads
    the same float8 cache: both write it with the same fused kernel)."""
    for q_heads in (24, 16):
        _backend_against_torch("triton", torch.bfloat16, q_heads, kv_dtype)


def _backend_against_torch(name: str, dtype: torch.dtype, q_heads: int, kv_dtype: torch.dtype | None = None) -> None:
    gen = torch.Generator().manual_seed(0)
    kw = dict(num_layers=1, num_pages=64, page_size=16, num_q_heads=q_heads, num_kv_heads=8, head_dim=128,
              dtype=dtype, device="cuda", kv_dtype=kv_dtype)
    ref, fi = make_attention_backend("torch", **kw), make_attention_backend(name, **kw)
    init = torch.randn(ref.kv_caches[0].shape, generator=gen).to(ref.kv_caches[0].dtype).cuda()
    ref.kv_caches[0].copy_(init)
    fi.kv_caches[0].copy_(init)
    perm = (torch.randperm(63, generator=gen) + 1).tolist()
    cases = [([5, 17, 1], [5, 40, 33]), ([1, 1, 1, 1], [1, 16, 17, 70]), ([1], [70]), ([1, 1], [16, 33])]
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
        last = torch.zeros(len(qo_lens), dtype=torch.int32).pin_memory()
        paged_kv_offsets(np.array(kv_lens), 16, kv_indptr.numpy(), last.numpy())
        kv_indices = torch.zeros(table.numel(), dtype=torch.int32, device="cuda")
        _kv_indices(table.cuda(), kv_indptr.cuda(), kv_indices)
        bufs = AttentionBuffers(table.cuda(), torch.tensor(kv_lens, dtype=torch.int32).cuda(), indptr.cuda(),
                                torch.tensor(slots).cuda(), kv_indices, kv_indptr, last, indptr.pin_memory())
        inputs = PlanInputs(kv_indptr, last, indptr.pin_memory(), kv_indices, max_pages_per_seq=8)
        plan = AttentionPlan(len(qo_lens), qo_lens, kv_lens, num_rows=len(qo_lens), decode=max(qo_lens) == 1)
        q = torch.randn(t, q_heads, 128, generator=gen).to(dtype).cuda()
        k = torch.randn(t, 8, 128, generator=gen).to(dtype).cuda()
        v = torch.randn(t, 8, 128, generator=gen).to(dtype).cuda()
        outs = []
        for backend in (ref, fi):
            backend.plan(plan, inputs)
            outs.append(backend.forward(0, q, k, v, bufs).float())
        rel = (outs[0] - outs[1]).norm() / outs[0].norm()
        assert rel.item() < 2e-2
        assert torch.equal(ref.kv_caches[0].view(torch.uint8), fi.kv_caches[0].view(torch.uint8))


# (model, bench kwargs, weights MiB range): the full-size layouts with dummy weights in bfloat16, graphs on
FULL_SIZE_DUMMIES = [
    ("orpheus", {"max_tokens": 70, "ignore_eos": True}, (5500, 7500)),  # 3.3B parameters (LM) + SNAC
    # CSM-1B: 1.68B parameters (backbone 1.37B, depth decoder 0.18B, Mimi decoder and encoder 0.13B)
    ("csm", {"max_tokens": 25, "ignore_eos": True, "speaker": 1}, (3000, 3500)),
]


@pytest.mark.parametrize("model,fields,weights_range", FULL_SIZE_DUMMIES, ids=[m[0] for m in FULL_SIZE_DUMMIES])
def test_full_size_dummy_loads_and_serves(model: str, fields: dict, weights_range: tuple[int, int]) -> None:
    cmd = [sys.executable, "-m", "vox_serve.launch", "--model", model, "--load-format", "dummy",
           "--device", "cuda", "--bench-requests", "2", "--max-model-len", "512", "--max-batch-size", "8",
           "--bench-kwargs", json.dumps(fields)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights_mib = float(re.search(r"weights (\d+) MiB", proc.stderr).group(1))
    assert weights_range[0] < weights_mib < weights_range[1]
    assert proc.stdout.count(" length") == 2


def test_qwen3_codec_priming_on_cuda_equals_decoding_the_prefix_first() -> None:
    """`CodecSlots.prime_slots` on the GPU (the masked attention of its left padding included) vs one decode of
    prefix + rest on the CPU, in float32, the 72-frame window of the released codec."""
    from tests.test_qwen3_codec import TINY
    from vox_serve.codecs.qwen3.decoder import Qwen3CodecDecoder, Qwen3CodecSlots

    cpu = Qwen3CodecDecoder.random(dataclasses.replace(TINY, sliding_window=72), seed=0)
    gpu = Qwen3CodecDecoder.random(dataclasses.replace(TINY, sliding_window=72), seed=0).to("cuda")
    g = torch.Generator().manual_seed(3)
    prefix, rest = torch.randint(0, 2048, (3, 90, 16), generator=g), torch.randint(0, 2048, (3, 12, 16), generator=g)
    lengths = torch.tensor([5, 0, 90])
    pool = Qwen3CodecSlots(gpu, num_slots=4)
    slots = torch.tensor([2, 0, 3], device="cuda")
    pool.prime_slots(slots, prefix.cuda(), lengths.cuda())
    got = torch.cat([pool.decode_chunk(rest[:, :4].cuda(), slots), pool.decode_chunk(rest[:, 4:].cuda(), slots)], -1)
    for b, n in enumerate(lengths.tolist()):
        want = cpu.decode(torch.cat([prefix[b:b + 1, :n], rest[b:b + 1]], 1))[0, n * 1920:]
        assert (got[b].cpu() - want).abs().max().item() < 1e-4, n

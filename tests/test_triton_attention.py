"""The planless Triton attention backend (`--attention-backend triton`) and the float8 KV cache
(`--kv-cache-dtype fp8`).

The kernel checks run on the CPU through Triton's interpreter, each as this file run as a script in a fresh process
with TRITON_INTERPRET=1 (`python tests/test_triton_attention.py <check>`): rt/attention/triton_prefill's causal
kernel against a float32 reference over ragged sequences with earlier context, padded sequences and padded tokens;
rt/attention/triton_decode reading a float8 cache; the fused rope + KV write saturating into a float8 cache. The
interpreter's bfloat16 tl.dot is wrong (Triton 3.9), so q is float32 there; the GPU tier (tests/test_gpu.py) runs
the backend in bfloat16 against the PyTorch one, float8 cache included.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
HAS_TRITON = importlib.util.find_spec("triton") is not None
FP8 = torch.float8_e4m3fn

from tests.test_decode_attention import random_case  # noqa: E402
from tests.test_decode_attention import reference as decode_reference  # noqa: E402
from vox_serve.cli import CliError, build_config, check_flags, given_flags  # noqa: E402
from vox_serve.rt.attention import make_attention_backend  # noqa: E402
from vox_serve.rt.attention.base import AttentionBuffers, AttentionPlan, PlanInputs  # noqa: E402
from vox_serve.rt.attention.kv_write import FP8_MAX, kv_cache_dtype, to_cache  # noqa: E402
from vox_serve.rt.attention.select import auto_backend, flashinfer_unsupported  # noqa: E402


def prefill_reference(q: torch.Tensor, cache: torch.Tensor, table: torch.Tensor, kv_lens: torch.Tensor,
                      qo_indptr: torch.Tensor, scale: float) -> torch.Tensor:
    """Sequence by sequence in float32: token i of a sequence of qo_len new tokens and kv_len tokens of KV sits at
    kv_len - qo_len + i and attends every position up to its own; rows of no sequence stay zero."""
    page, hkv = cache.shape[2], cache.shape[3]
    out = torch.zeros(q.shape)
    for s in range(table.shape[0]):
        b, e, n = int(qo_indptr[s]), int(qo_indptr[s + 1]), int(kv_lens[s])
        t = torch.arange(n)
        pages = table[s, t // page].long()
        k, v = cache[pages, 0, t % page].float(), cache[pages, 1, t % page].float()  # [n, Hkv, D]
        for i in range(e - b):
            seen = n - (e - b) + i + 1
            qg = q[b + i].float().view(hkv, -1, q.shape[2])
            p = torch.softmax(torch.einsum("hgd,nhd->hgn", qg, k[:seen]) * scale, dim=-1)
            out[b + i] = torch.einsum("hgn,nhd->hgd", p, v[:seen]).reshape(q.shape[1], q.shape[2])
    return out


PREFILL_CASES = (  # (qo lens, kv lens, Hq, Hkv, page size): a qo len below its kv len has earlier context
    ([5, 17, 1], [5, 40, 33], 6, 2, 4),  # group 3 (Orpheus's)
    ([3, 0, 70], [3, 1, 90], 8, 8, 8),  # group 1, a padded sequence (no tokens), a sequence over several tiles
    ([16, 2], [16, 2], 4, 1, 16),  # group 4
    ([9], [31], 4, 2, 4),  # group 2, a chunk after 22 tokens of context
)


def check_prefill(device: str = "cpu") -> None:
    """Every case with float32, bfloat16 and float8 caches; three padded token rows after the last sequence."""
    from vox_serve.rt.attention import triton_prefill

    d = 16 if device == "cpu" else 128
    q_dtype = torch.float32 if device == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    for cache_dtype in (torch.float32, torch.bfloat16, FP8):
        for i, (qo_lens, kv_lens, hq, hkv, page) in enumerate(PREFILL_CASES):
            _, cache, table, lens = random_case(len(kv_lens), kv_lens, hq, hkv, d, page, torch.float32, seed=i)
            cache = to_cache(cache, cache_dtype)
            qo = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
            q = torch.randn(int(qo[-1]) + 3, hq, d, generator=gen).to(q_dtype)
            ref = prefill_reference(q, cache, table, lens, qo, d ** -0.5)
            got = triton_prefill.prefill_attention(q.to(device), cache.to(device), table.to(device), lens.to(device),
                                                   qo.to(device), d ** -0.5)
            err = (got.float().cpu() - ref).abs().max().item()
            tol = 1e-5 if q_dtype == torch.float32 else 2e-2
            assert got.dtype == q_dtype and err < tol, (cache_dtype, i, err)
            assert not got[int(qo[-1]):].any()


def check_decode_fp8(device: str = "cpu") -> None:
    """rt/attention/triton_decode over a float8 cache (float32 q): FMA and tensor-core paths, split or not; then
    a bfloat16 q over it, the cache read as bfloat16 or as float16."""
    from vox_serve.rt.attention import triton_decode as dk

    d = 16 if device == "cpu" else 64
    for i, (rows, lens, hq, hkv, page) in enumerate(((3, [5, 17, 40], 6, 2, 4), (2, [64, 3], 8, 8, 8))):
        q, cache, table, kv_lens = random_case(rows, lens, hq, hkv, d, page, torch.float32, seed=i)
        cache = to_cache(cache, FP8)
        ref = decode_reference(q, cache, table, kv_lens, 0.25)
        q, cache, table, kv_lens = (t.to(device) for t in (q, cache, table, kv_lens))
        for config in (dk.DecodeConfig(block_n=8, dot=False), dk.DecodeConfig(block_n=32, dot=True)):
            for splits in (1, 4):
                ws = dk.DecodeWorkspace.allocate(rows, hkv, hq // hkv, d, splits, torch.device(device))
                got = dk.decode_attention(q, cache, table, kv_lens, 0.25, ws, config).cpu()
                tol = 2e-2 if config.dot and device != "cpu" else 1e-5  # compiled, float32 dots run as TF32
                assert (got - ref).abs().max().item() < tol, (i, config, splits)
        # a bfloat16 q: the cache read as float16 ("/f") or as bfloat16 (the default); the interpreter's
        # bfloat16 tl.dot is wrong, so the bfloat16 route runs on FMAs
        for config in (dk.DecodeConfig(block_n=8, dot=False, f16=True), dk.DecodeConfig(block_n=32, f16=True),
                       dk.FP8_LARGE, dk.DecodeConfig(block_n=8, dot=False)):
            ws = dk.DecodeWorkspace.allocate(rows, hkv, hq // hkv, d, 4, torch.device(device))
            got = dk.decode_attention(q.bfloat16(), cache, table, kv_lens, 0.25, ws, config).cpu()
            assert got.dtype == torch.bfloat16 and (got.float() - ref).abs().max().item() < 2e-2, (i, config)


def check_write_fp8(device: str = "cpu") -> None:
    """The fused rope + KV write into a float8 cache stores `to_cache` of the unfused path's values, and values past
    the float8 range saturated, not NaN. Compiled it is exact; the interpreter's float32 -> float8 conversion is
    not (it rounds 7.83 down to 4: a carry out of the mantissa is lost), so there only the binade is checked."""
    from vox_serve.rt import triton_ops

    gen = torch.Generator().manual_seed(3)
    t, hq, hkv, d, page = 5, 4, 2, 16, 4
    q, k = torch.randn(t, hq, d, generator=gen), torch.randn(t, hkv, d, generator=gen) * 4
    v = torch.randn(t, hkv, d, generator=gen) * 4
    k[0, 0, 0], v[1, 1, 3], v[2, 0, 5] = 1000.0, -5000.0, 449.0
    pos = torch.tensor([0, 3, 7, 8, 9])
    angles = torch.arange(16)[:, None] * torch.linspace(0.1, 1.0, d)[None, :]
    cos, sin = torch.cos(angles), torch.sin(angles)
    slots = torch.tensor([9, 2, 15, 4, 6])
    cache = torch.zeros(4, 2, page, hkv, d, dtype=FP8, device=device)
    args = [x.to(device) for x in (q, k, v)]
    triton_ops.rope_write_kv(*args, cache[:, 0], cache[:, 1], slots.to(device), cos=cos.to(device),
                             sin=sin.to(device), positions=pos.to(device))
    half = d // 2
    c, s = cos[pos][:, None, :half], sin[pos][:, None, :half]
    k1, k2 = k[..., :half], k[..., half:]
    rotated = torch.cat([k1 * c - k2 * s, k2 * c + k1 * s], dim=-1)
    cache = cache.cpu()
    got_k = cache[slots // page, 0, slots % page].float()
    got_v = cache[slots // page, 1, slots % page].float()
    for got, want in ((got_k, to_cache(rotated, FP8).float()), (got_v, to_cache(v, FP8).float())):
        assert torch.isfinite(got).all()
        if device == "cpu":
            assert ((got - want).abs() <= want.abs().clamp(min=2.0 ** -6) / 2).all()
        else:
            assert torch.equal(got, want)
    assert got_k[0, 0, 0] == FP8_MAX and got_v[1, 1, 3] == -FP8_MAX and got_v[2, 0, 5] == FP8_MAX


CHECKS = {"prefill": check_prefill, "decode_fp8": check_decode_fp8, "write_fp8": check_write_fp8}


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("check", sorted(CHECKS))
def test_interpreted(check: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), check], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# ---- choosing the cache dtype and the backend -------------------------------------------------------------

def backend_kwargs(**over: object) -> dict:
    return {"num_layers": 2, "num_pages": 9, "page_size": 4, "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16,
            "dtype": torch.float32, "device": "cpu", **over}


def test_kv_cache_dtype_names() -> None:
    assert kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert kv_cache_dtype("fp8", torch.bfloat16) == FP8
    with pytest.raises(ValueError, match="--kv-cache-dtype"):
        kv_cache_dtype("int4", torch.bfloat16)


def config_of(*argv: str, runtime: str = "rust"):  # noqa: ANN201
    return build_config(check_flags(given_flags(list(argv)), runtime, True)[0], runtime)


@pytest.mark.parametrize("runtime", ["rust", "python"])
def test_flags_reach_the_config(runtime: str) -> None:
    assert config_of("--kv-cache-dtype", "fp8", runtime=runtime).cache.kv_cache_dtype == "fp8"
    assert config_of(runtime=runtime).cache.kv_cache_dtype == "auto"
    assert config_of("--attention-backend", "triton", runtime=runtime).engine.attention_backend == "triton"
    with pytest.raises((CliError, SystemExit)):
        config_of("--kv-cache-dtype", "fp16", runtime=runtime)
    both = config_of("--kv-cache-dtype", "fp8", "--attention-backend", "flashinfer", runtime=runtime)
    assert (both.cache.kv_cache_dtype, both.engine.attention_backend) == ("fp8", "flashinfer")


def test_flashinfer_reads_float8_only_and_the_triton_backend_needs_a_gpu() -> None:
    on_gpu = backend_kwargs(device="cuda", dtype=torch.bfloat16, head_dim=128)
    with pytest.raises(RuntimeError, match="flashinfer backend not available: .*float8 e4m3, not torch.float16"):
        make_attention_backend("flashinfer", **on_gpu, kv_dtype=torch.float16)
    why = flashinfer_unsupported(**on_gpu, kv_dtype=FP8)  # float8 it reads: refused here only when not installed
    assert why is None or "not installed" in why, why
    with pytest.raises(RuntimeError, match="triton attention backend not available: it needs a CUDA device"):
        make_attention_backend("triton", **backend_kwargs(kv_dtype=FP8))
    assert auto_backend(**backend_kwargs(kv_dtype=FP8)) == "torch"  # the CPU: the reference reads float8 too


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_triton_backend_refuses_pages_its_decode_blocks_do_not_tile() -> None:
    from vox_serve.rt.attention.triton_backend import triton_unsupported

    assert triton_unsupported(device="cuda", head_dim=128, page_size=16) is None
    why = triton_unsupported(device="cuda", head_dim=128, page_size=96)
    assert why is not None and "page size 96" in why and "32, 64, 128" in why


def test_torch_backend_keeps_a_float8_cache_close_to_a_full_one() -> None:
    """Prefill then decode over the same K/V in a float32 and a float8 cache: the outputs agree within float8's
    precision (a relative error of a few percent: 3 mantissa bits, averaged by the softmax), and the float8
    cache takes a quarter of the bytes."""
    gen = torch.Generator().manual_seed(5)
    full = make_attention_backend("torch", **backend_kwargs())
    narrow = make_attention_backend("torch", **backend_kwargs(kv_dtype=FP8))
    assert narrow.kv_caches[0].dtype == FP8 and narrow.memory_bytes() * 4 == full.memory_bytes()
    table = torch.tensor([[3, 5, 7, 0]], dtype=torch.int32)
    for qo_len, kv_len in ((10, 10), (1, 11), (1, 12)):
        slots = torch.tensor([int(table[0, p // 4]) * 4 + p % 4 for p in range(kv_len - qo_len, kv_len)])
        qo = torch.tensor([0, qo_len], dtype=torch.int32)
        bufs = AttentionBuffers(table, torch.tensor([kv_len], dtype=torch.int32), qo, slots)
        plan = AttentionPlan(1, [qo_len], [kv_len], num_rows=1, decode=qo_len == 1)
        inputs = PlanInputs(torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), qo, None, 4)
        q, k, v = (torch.randn(qo_len, h, 16, generator=gen) for h in (4, 2, 2))
        outs = []
        for backend in (full, narrow):
            backend.plan(plan, inputs)
            outs.append(backend.forward(0, q, k, v, bufs))
        rel = ((outs[0] - outs[1]).norm() / outs[0].norm()).item()
        assert 0 < rel < 0.05, (qo_len, kv_len, rel)


# ---- GPU tier ---------------------------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="CUDA + Triton")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("check", ["prefill", "write_fp8", "decode_fp8"])
def test_compiled(check: str) -> None:
    """The interpreter's checks compiled: the prefill with bfloat16 q on the tensor cores at head dim 128, the
    float8 write exact, the decode over a float8 cache (bfloat16 on the tensor cores too)."""
    CHECKS[check]("cuda")


if __name__ == "__main__":
    CHECKS[sys.argv[1]]()
    print("ok")

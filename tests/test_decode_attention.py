"""rt/attention/triton_decode (planless split-KV decode attention, served at 1-2 rows) against a float32
reference.

The kernel checks run on the CPU through Triton's interpreter (chosen when Triton is imported), each as this file
run as a script in a fresh process with TRITON_INTERPRET=1 (`python tests/test_decode_attention.py <check>`).
The interpreter's bfloat16 tl.dot is wrong (Triton 3.9), so on the CPU the tensor-core path runs in float32 only;
the GPU tier (marked gpu) checks bfloat16 on the tensor cores and in a CUDA graph.
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
HAS_TRITON = importlib.util.find_spec("triton") is not None


def kernel_module():
    """The kernel's module."""
    from vox_serve.rt.attention import triton_decode

    return triton_decode


def reference(q: torch.Tensor, cache: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor,
              scale: float) -> torch.Tensor:
    """Row by row in float32: the row's first kv_len tokens gathered through its page table, softmax attention
    with the query heads grouped over the KV heads."""
    page = cache.shape[2]
    rows, hq, d = q.shape
    hkv = cache.shape[3]
    out = torch.empty(rows, hq, d)
    for r in range(rows):
        n = int(kv_lens[r])
        t = torch.arange(n)
        pages = page_table[r, t // page].long()
        k = cache[pages, 0, t % page].float()  # [n, Hkv, D]
        v = cache[pages, 1, t % page].float()
        qg = q[r].float().view(hkv, hq // hkv, d)
        p = torch.softmax(torch.einsum("hgd,nhd->hgn", qg, k) * scale, dim=-1)
        out[r] = torch.einsum("hgn,nhd->hgd", p, v).reshape(hq, d)
    return out


def random_case(rows: int, kv_lens: list[int], hq: int, hkv: int, d: int, page: int, dtype: torch.dtype,
                seed: int) -> tuple[torch.Tensor, ...]:
    """q, a cache of shuffled pages (page 0: the null page), each row's page table and KV lengths."""
    gen = torch.Generator().manual_seed(seed)
    cols = max(-(-n // page) for n in kv_lens) + 1
    num_pages = 1 + rows * cols
    cache = torch.randn(num_pages, 2, page, hkv, d, generator=gen).to(dtype)
    order = torch.randperm(num_pages - 1, generator=gen) + 1
    page_table = order.view(rows, cols).to(torch.int32)
    page_table[:, -1] = 0  # a used table's unused columns: the null page
    q = torch.randn(rows, hq, d, generator=gen).to(dtype)
    return q, cache, page_table, torch.tensor(kv_lens, dtype=torch.int32)


CASES = (  # (rows, kv lens, Hq, Hkv, page size)
    (1, [1], 4, 2, 4),
    (3, [5, 17, 40], 6, 2, 4),  # group 3 (Orpheus's), lengths not multiples of the page or block
    (2, [64, 3], 8, 8, 8),  # group 1
    (4, [33, 1, 100, 16], 4, 1, 16),  # group 4, page 16, a padded row (length 1)
)


def check_kernel(device: str = "cpu") -> None:
    """Every case at split counts 1, 2 and 8 (some splits empty), blocks smaller and larger than a page, FMA and
    tensor-core paths, programs row-major and head-major; launched twice with the same workspace (its counters
    reset themselves)."""
    dk = kernel_module()

    d = 16 if device == "cpu" else 64
    configs = [dk.DecodeConfig(block_n=8, dot=False), dk.DecodeConfig(block_n=32, dot=False, warps=2),
               dk.DecodeConfig(block_n=8, dot=False, head_major=True), dk.DecodeConfig(block_n=32, dot=True),
               dk.WIDE_LARGE, dk.FP8_SMALL]  # the measured ones: blocks of several pages
    for dtype in (torch.float32, torch.bfloat16):
        for config in configs:
            if config.dot and dtype == torch.bfloat16 and device == "cpu":
                continue  # the interpreter's bfloat16 tl.dot is wrong
            for i, (rows, lens, hq, hkv, page) in enumerate(CASES):
                q, cache, table, kv_lens = random_case(rows, lens, hq, hkv, d, page, dtype, seed=i)
                ref = reference(q, cache, table, kv_lens, d ** -0.5)
                for splits in (1, 2, 8):
                    ws = dk.DecodeWorkspace.allocate(rows, hkv, hq // hkv, d, splits,
                                                     torch.device(device))
                    for _ in range(2):
                        got = dk.decode_attention(q.to(device), cache.to(device), table.to(device),
                                                  kv_lens.to(device), d ** -0.5, ws, config)
                        err = (got.float().cpu() - ref).abs().max().item()
                        tol = 1e-5 if dtype == torch.float32 and not config.dot else 2e-2
                        if dtype == torch.float32 and config.dot and device == "cuda":
                            tol = 2e-2  # the tensor cores take float32 as TF32
                        assert got.dtype == dtype and err < tol, (dtype, config, i, splits, err)
                    assert not ws.counters.any()


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_interpreted() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "kernel"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_splits_for_fills_the_device() -> None:
    dk = kernel_module()
    splits_for, MAX_SPLITS = dk.splits_for, dk.MAX_SPLITS

    assert splits_for(1, 8, 132) == MAX_SPLITS  # 8 programs would leave most SMs idle
    assert splits_for(16, 8, 132) == 4  # 512 programs
    assert splits_for(256, 8, 132) == 1
    for rows in (1, 2, 3, 5, 64):
        s = splits_for(rows, 8, 132)
        assert s & (s - 1) == 0 and 1 <= s <= MAX_SPLITS


def serves(rows: int = 1, q_heads: int = 4, head_dim: int = 16, tensor_cores: bool = False, cuda: bool = True,
           page_size: int = 4) -> bool:
    """triton_decode.serves_geometry for a cache of 2 KV heads and pages of 4 tokens."""
    return kernel_module().serves_geometry(rows=rows, q_heads=q_heads, kv_heads=2, head_dim=head_dim,
                                           page_size=page_size, tensor_cores=tensor_cores, cuda=cuda)


def test_serves_few_row_cuda_launches_only(monkeypatch: pytest.MonkeyPatch) -> None:
    dk = kernel_module()

    assert not serves(cuda=False)  # a CPU tensor: FlashInfer's backend is CUDA only anyway
    assert serves() == (dk.triton is not None)
    assert not serves(rows=dk.MAX_ROWS + 1)
    assert not serves(head_dim=12)  # a head dim that is no power of two
    assert not serves(tensor_cores=True)  # FlashInfer's tensor-core decode stays, unless "all"
    monkeypatch.setenv(dk.ENV, "all")
    assert serves(tensor_cores=True) == (dk.triton is not None)
    monkeypatch.setenv(dk.ENV, "0")
    assert not serves()
    monkeypatch.setenv(dk.ENV, "yes")
    with pytest.raises(ValueError, match="VOX_TRITON_DECODE"):
        serves()


def test_row_limit_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buckets of WIDE_ROWS are served at every geometry by default; VOX_TRITON_DECODE_ROWS instead serves every
    bucket up to its limit; anything but a positive count is refused."""
    dk = kernel_module()
    on = dk.triton is not None
    assert not serves(rows=8) and not serves(rows=512)
    assert serves(rows=16) == serves(rows=64) == serves(rows=256, tensor_cores=True) == on  # WIDE_ROWS, any geometry
    assert not serves(rows=257)
    monkeypatch.setenv(dk.ROWS_ENV, "64")
    assert serves(rows=64) == (dk.triton is not None)
    assert not serves(rows=65) and not serves(rows=256)  # a set limit replaces WIDE_ROWS
    monkeypatch.setenv(dk.ROWS_ENV, "1")
    assert not serves(rows=2) and not serves(rows=16)  # a set limit replaces WIDE_ROWS
    monkeypatch.delenv(dk.ROWS_ENV)
    monkeypatch.setenv(dk.ENV, "0")
    assert not serves(rows=16)
    monkeypatch.delenv(dk.ENV)
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv(dk.ROWS_ENV, bad)
        with pytest.raises(ValueError, match=dk.ROWS_ENV):
            dk.max_rows()


def test_config_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """VOX_TRITON_DECODE_CONFIG sets every launch's configuration (BLOCK_N/WARPS/STAGES[/h]); malformed ones are
    refused with the expected form."""
    dk = kernel_module()
    monkeypatch.delenv(dk.CONFIG_ENV, raising=False)
    assert dk.config_for(1, torch.bfloat16) == dk.config_for(64, torch.bfloat16) == dk.DEFAULT_CONFIG
    assert dk.config_for(65, torch.bfloat16) == dk.config_for(256, torch.float16) == dk.WIDE_LARGE  # measured
    assert dk.config_for(64, torch.float8_e4m3fn) == dk.FP8_SMALL and dk.config_for(256, torch.float8_e4m3fn) == \
        dk.FP8_LARGE
    assert dk.FP8_LARGE.name == "128/4/2/f" and dk.FP8_SMALL.name == "64/4/2"  # measured (h100-2026-12-07f)
    monkeypatch.setenv(dk.CONFIG_ENV, "128/8/3/h")
    assert dk.config_for(256, torch.float8_e4m3fn) == dk.DecodeConfig(block_n=128, warps=8, stages=3,
                                                                      head_major=True)
    assert dk.config_for(1, torch.bfloat16).name == "128/8/3/h"  # what parse reads back
    assert dk.DecodeConfig.parse("64/4/2/h/f") == dk.DecodeConfig(block_n=64, warps=4, stages=2, head_major=True,
                                                                   f16=True)
    assert dk.DecodeConfig.parse("64/4/2/f").name == "64/4/2/f"
    for bad in ("128/8", "64/4/3/x", "0/4/3", "a/b/c", "64/4/3/h/h"):
        with pytest.raises(ValueError, match="BLOCK_N/WARPS/STAGES"):
            dk.DecodeConfig.parse(bad)


def test_pages_must_tile_with_every_block() -> None:
    dk = kernel_module()
    assert dk.blocks_fit(16) and dk.blocks_fit(256) and not dk.blocks_fit(96)  # 96: a multiple of 32, not of 64
    assert not serves(rows=16, page_size=96)


def test_rejects_a_workspace_of_another_geometry() -> None:
    dk = kernel_module()

    q, cache, table, kv_lens = random_case(2, [3, 4], 4, 2, 16, 4, torch.float32, seed=0)
    ws = dk.DecodeWorkspace.allocate(1, 2, 2, 16, 2, torch.device("cpu"))  # one row
    with pytest.raises(ValueError, match="workspace"):
        dk.decode_attention(q, cache, table, kv_lens, 0.25, ws)
    with pytest.raises(ValueError, match="does not fit"):
        dk.decode_attention(q[:, :3], cache, table, kv_lens, 0.25, ws)


# ---- GPU tier ---------------------------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="CUDA + Triton")


@pytest.mark.gpu
@needs_gpu
def test_compiled() -> None:
    """The interpreter's check with the kernel compiled (bfloat16 on the tensor cores too)."""
    check_kernel("cuda")


@pytest.mark.gpu
@needs_gpu
def test_orpheus_geometry_in_a_cuda_graph() -> None:
    """Orpheus 3B's geometry (24 query heads over 8, head dim 128, pages of 16, bfloat16) captured once per
    bucket with the default configuration; replays after the rows' lengths and page tables change in place."""
    dk = kernel_module()

    gen = torch.Generator().manual_seed(7)
    for rows in (1, 4, 16, 64):  # 16 and 64: WIDE_ROWS, served at this tensor-core geometry
        lens = torch.randint(1, 1500, (rows,), generator=gen).tolist()
        q, cache, table, kv_lens = (t.cuda() for t in random_case(rows, [2048] * rows, 24, 8, 128, 16,
                                                                    torch.bfloat16, seed=rows))
        kv_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        ws = dk.DecodeWorkspace.allocate(rows, 8, 3, 128, dk.splits_for(rows, 8, 132), q.device)
        dk.decode_attention(q, cache, table, kv_lens, 128 ** -0.5, ws)  # compiled outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = dk.decode_attention(q, cache, table, kv_lens, 128 ** -0.5, ws)
        for trial in range(3):
            if trial:
                kv_lens.copy_(torch.randint(1, 2048, (rows,), generator=gen, dtype=torch.int32))
                table.copy_(table[torch.randperm(rows, generator=gen).cuda()])
            graph.replay()
            ref = reference(q.cpu(), cache.cpu(), table.cpu(), kv_lens.cpu(), 128 ** -0.5)
            err = (out.float().cpu() - ref).abs().max().item()
            assert err < 2e-2, (rows, trial, err)
        assert not ws.counters.any()


if __name__ == "__main__":
    globals()[f"check_{sys.argv[1]}"]()
    print("ok")

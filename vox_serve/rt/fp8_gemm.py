"""Projections with float8 weights (`--quantization fp8`): weights stored as float8 e4m3 with one float32 scale per
output channel, so a decode step at a few rows reads half the bytes it reads in bfloat16.

- `quantize_weight(w [N, K])` -> (float8 [N, K], scale [N]): scale = the row's largest |w| / 448 (e4m3's largest
  finite value), so every row uses the format's whole range;
- `reference_linear(x, wq, scale)`: x @ (wq * scale).T in float32, rounded to x's dtype: what the weight-only path
  computes (rt/small_gemm's kernels with `scale`, at the rows its table serves), and what CPUs run;
- `scaled_linear(x, wq, scale)`: the rows quantized too (one float8 scale per row, `quantize_rows`), then
  cuBLASLt's float8 GEMM (`torch._scaled_mm`, row-wise scales): the float8 tensor cores, for every other shape on
  a GPU of compute capability 8.9 or more;
- `scaled_mm(xq, x_scale, wq, scale)`: that GEMM over rows quantized already: the decoder layer has the kernel
  before a projection store its rows in float8 (`triton_ops.add_rms_norm_fp8` before q/k/v and gate/up,
  `silu_mul_fp8` before down: `layers/decoder.norm_project`, `gated_project`), so only the o projection's input
  (and a stack's first q/k/v input, which no add precedes) takes a `quantize_rows` launch of its own (before: 4
  per layer, 0.47 ms of Orpheus' 8.8 ms step at 256 rows on an H100; after: 29 launches, 0.11 ms of the 64-row step,
  benchmark/results/h100-2026-12-07f);
- the GEMM itself is cuBLASLt's unless the GPU's table (`fp8_gemm_tables/<gpu model>.json`, written by
  `benchmark/fp8_gemm.py`; `VOX_FP8_GEMM_TABLE` names another, `VOX_FP8_GEMM=0` keeps cuBLASLt) has a measured
  Triton configuration for the shape and rows bucket (`_scaled_mm_kernel`): at 256 rows cuBLASLt runs every
  Orpheus projection on 128 x 128 tiles, 48 of them for the o and down projections on a 132-SM H100;
- `linear(x, wq, scale)`: the float8 GEMM on a GPU, the reference on a CPU (`Fp8Linear.forward`; the decoder layer
  tries rt/small_gemm's kernels first, `layers/decoder.project`).

Weight-only at a few rows (reading the weight is the cost; the activations stay exact) and float8 GEMMs from
there on (the tensor cores' float8 rate where the step is compute-bound) is how the common serving engines run
float8 checkpoints on Hopper. The two differ by the rows' rounding to float8 (e4m3: 3 mantissa bits, up to 6 %
of an element, averaging out over K).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from vox_serve.rt import small_gemm, triton_ops

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton: the rows are quantized with torch ops
    triton = None

FP8 = triton_ops.FP8
FP8_MAX = 448.0  # e4m3's largest finite value
MIN_SCALE = 1e-12  # an all-zero row keeps a positive scale (its values quantize to 0)
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada and Hopper on
interpret = False  # tests: the Triton kernels (`quantize_rows`, `scaled_mm`) on CPU tensors too (TRITON_INTERPRET=1)
TABLES_DIR = Path(__file__).resolve().parent / "fp8_gemm_tables"
TABLE_ENV = "VOX_FP8_GEMM_TABLE"  # a table to use instead of the GPU model's packaged one
ENV = "VOX_FP8_GEMM"  # "0": cuBLASLt for every shape


@dataclass(frozen=True)
class GemmConfig:
    """The Triton float8 GEMM's tile (rows, columns, K), warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    warps: int = 4
    stages: int = 4

    def as_list(self) -> list[int]:
        return [self.block_m, self.block_n, self.block_k, self.warps, self.stages]

    @classmethod
    def of_list(cls, values: list[int]) -> GemmConfig:
        bm, bn, bk, warps, stages = values
        return cls(block_m=bm, block_n=bn, block_k=bk, warps=warps, stages=stages)


GemmKey = tuple[int, int, int]  # rows bucket (small_gemm.rows_bucket), N, K
forced: Callable[[int, int, int], GemmConfig | None] | None = None  # tests: a configuration for every (M, N, K)


def unsupported(device: torch.device, dtype: torch.dtype, shapes: list[tuple[int, int]]) -> str | None:
    """Why float8 weights of these [N, K] shapes cannot serve a model of `dtype` on `device`, or None: CPUs run
    the reference; CUDA devices need float8 tensor cores (compute capability 8.9), and cuBLASLt's row-wise scaled
    GEMM a bfloat16 output and sizes in multiples of 16."""
    if device.type != "cuda":
        return None
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (f"--quantization fp8 needs float8 tensor cores (compute capability 8.9 or more); "
                f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}")
    if dtype != torch.bfloat16:
        return f"--quantization fp8 serves bfloat16 models on a GPU, not {dtype} (--dtype)"
    odd = [shape for shape in shapes if shape[0] % 16 or shape[1] % 16]
    if odd:
        return f"--quantization fp8: projections of {odd[0][0]} x {odd[0][1]} are not multiples of 16"
    return None


def quantize_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [N, K] -> (float8 e4m3 [N, K], float32 scale [N]) with w ~= wq * scale[:, None] (per output channel)."""
    wf = w.detach().float()
    scale = (wf.abs().amax(dim=1) / FP8_MAX).clamp_min(MIN_SCALE)
    wq = (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return wq.contiguous(), scale.contiguous()


def dequantize_weight(wq: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """wq * scale as a [N, K] tensor of `dtype` (tests and benchmarks: what the weight-only path multiplies by)."""
    return (wq.float() * scale[:, None]).to(dtype)


def reference_linear(x: Tensor, wq: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [M, K] @ (wq * scale).T (+ bias) in float32, rounded to x's dtype."""
    y = (x.float() @ wq.float().T) * scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (float8 [M, K], float32 scale [M, 1]), per row as `quantize_weight` does per weight row: one
    Triton launch on a GPU."""
    if triton is not None and (x.is_cuda or interpret) and x.shape[0] > 0:
        return _quantize_rows_triton(x)
    xf = x.float()
    scale = (xf.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(MIN_SCALE)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def scaled_linear(x: Tensor, wq: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [M, K] @ (wq * scale).T (+ bias) as float8 GEMM: x quantized per row, cuBLASLt with row-wise scales,
    the product in x's dtype."""
    xq, x_scale = quantize_rows(x)
    return scaled_mm(xq, x_scale, wq, scale, bias, x.dtype)


def scaled_mm(xq: Tensor, x_scale: Tensor, wq: Tensor, scale: Tensor, bias: Tensor | None, out_dtype: torch.dtype
              ) -> Tensor:
    """(xq * x_scale) @ (wq * scale).T (+ bias) in out_dtype for rows already quantized (`quantize_rows`, or
    the kernel before the projection: triton_ops.add_rms_norm_fp8, silu_mul_fp8)."""
    config = gemm_config(xq, wq)
    if config is not None:
        return _scaled_mm_triton(xq, x_scale, wq, scale, bias, out_dtype, config)
    y = torch._scaled_mm(xq, wq.T, scale_a=x_scale, scale_b=scale.view(1, -1), out_dtype=out_dtype)
    return y if bias is None else y + bias


def gemm_config(xq: Tensor, wq: Tensor) -> GemmConfig | None:
    """The Triton GEMM's configuration for these operands where the GPU's table has one for the shape (a measured
    win over cuBLASLt, `benchmark/fp8_gemm.py`), else None: cuBLASLt."""
    (m, k), n = xq.shape, wq.shape[0]
    if forced is not None:
        return forced(m, n, k) if triton is not None and (xq.is_cuda or interpret) else None
    if triton is None or not xq.is_cuda or os.environ.get(ENV, "1") == "0":
        return None
    return _table(xq.device.index or 0).get((small_gemm.rows_bucket(m), n, k))


def table_from_json(entries: list[dict]) -> dict[GemmKey, GemmConfig]:
    """[{"rows", "n", "k", "config": GemmConfig.as_list()}, ...] -> the table."""
    return {(int(e["rows"]), int(e["n"]), int(e["k"])): GemmConfig.of_list(e["config"]) for e in entries}


def read_table(path: Path) -> dict[GemmKey, GemmConfig]:
    """A table file, over the packaged table it names as "extends", if any (small_gemm.read_layered)."""
    return small_gemm.read_layered(path, TABLES_DIR, table_from_json)


@functools.cache
def _table(device_index: int) -> dict[GemmKey, GemmConfig]:
    """The device's table, read once (empty where the GPU model has none)."""
    name = torch.cuda.get_device_name(device_index)
    path = Path(os.environ.get(TABLE_ENV) or small_gemm.table_path(name, TABLES_DIR))
    return read_table(path) if path.is_file() else {}


def linear(x: Tensor, wq: Tensor, scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ (wq * scale).T (+ bias) -> [..., N]: the float8 GEMM on a GPU, the float32 reference on a CPU."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    y = scaled_linear(rows, wq, scale, bias) if rows.is_cuda else reference_linear(rows, wq, scale, bias)
    return y.reshape(*lead, wq.shape[0])


def _quantize_rows_triton(x: Tensor) -> tuple[Tensor, Tensor]:
    x = triton_ops.unit_last_stride(x)
    m, k = x.shape
    out = torch.empty(m, k, dtype=FP8, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(k)
    _quantize_rows_kernel[(m,)](x, out, scale, x.stride(0), k, BLOCK=block, num_warps=8 if block >= 4096 else 4)
    return out, scale


def _scaled_mm_triton(xq: Tensor, x_scale: Tensor, wq: Tensor, scale: Tensor, bias: Tensor | None,
                      out_dtype: torch.dtype, config: GemmConfig) -> Tensor:
    (m, k), n = xq.shape, wq.shape[0]
    if xq.stride(1) != 1 or not (wq.is_contiguous() and x_scale.is_contiguous() and scale.is_contiguous()):
        raise ValueError("the Triton float8 GEMM takes rows with unit column stride and contiguous weights, scales")
    out = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
    _scaled_mm_kernel[grid](xq, x_scale, wq, scale, bias if bias is not None else scale, out, m, n, k, xq.stride(0),
                            HAS_BIAS=bias is not None, EVEN_K=k % config.block_k == 0, BLOCK_M=config.block_m,
                            BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.warps,
                            num_stages=config.stages)
    return out


if triton is not None:

    @triton.jit(do_not_specialize=["M"])
    def _scaled_mm_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, out_ptr, M, N, K, stride_x, HAS_BIAS: tl.constexpr,
                          EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """One [BLOCK_M, BLOCK_N] tile of (x * xs) @ (w * ws).T (+ bias) per program, the float8 products summed in
        float32 on the tensor cores, both scales applied once after the K loop (what cuBLASLt's row-wise scaled
        GEMM computes). A column block's row tiles are consecutive programs, so its weight comes from HBM once
        and from the L2 for the others. Rows and columns past the ends load row 0's / column 0's values (wrapped:
        the loads need no mask) and are not stored."""
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        rm = (pid % tiles_m) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (pid // tiles_m) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        x_rows = x_ptr + (rm % M).to(tl.int64)[:, None] * stride_x
        w_rows = w_ptr + (rn % N).to(tl.int64)[:, None] * K
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                a = tl.load(x_rows + (k0 + rk)[None, :])
                b = tl.load(w_rows + (k0 + rk)[None, :])
            else:
                live = (k0 + rk)[None, :] < K
                a = tl.load(x_rows + (k0 + rk)[None, :], mask=live, other=0.0)
                b = tl.load(w_rows + (k0 + rk)[None, :], mask=live, other=0.0)
            acc = tl.dot(a, tl.trans(b), acc)
        acc = acc * tl.load(xs_ptr + rm % M)[:, None] * tl.load(ws_ptr + rn % N)[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn % N).to(tl.float32)[None, :]
        keep = (rm < M)[:, None] & (rn < N)[None, :]
        tl.store(out_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=keep)

    @triton.jit
    def _quantize_rows_kernel(x_ptr, out_ptr, scale_ptr, stride, K, BLOCK: tl.constexpr):
        """One row per program: its largest |x| / 448 as the scale, x / scale rounded to e4m3 (IEEE divisions, as
        the torch ops': the same bits)."""
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < K
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        triton_ops.store_fp8_row(x, out_ptr + row * K + cols, mask, scale_ptr + row)

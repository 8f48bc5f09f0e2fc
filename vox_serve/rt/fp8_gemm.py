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
  per layer, 0.47 ms of Orpheus' 8.8 ms step at 256 rows on an H100; the fused form is not timed yet);
- `linear(x, wq, scale)`: the float8 GEMM on a GPU, the reference on a CPU (`Fp8Linear.forward`; the decoder layer
  tries rt/small_gemm's kernels first, `layers/decoder.project`).

Weight-only at a few rows (reading the weight is the cost; the activations stay exact) and float8 GEMMs from
there on (the tensor cores' float8 rate where the step is compute-bound) is how the common serving engines run
float8 checkpoints on Hopper. The two differ by the rows' rounding to float8 (e4m3: 3 mantissa bits, up to 6 %
of an element, averaging out over K).
"""

from __future__ import annotations

import torch
from torch import Tensor

from vox_serve.rt import triton_ops

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton: the rows are quantized with torch ops
    triton = None

FP8 = triton_ops.FP8
FP8_MAX = 448.0  # e4m3's largest finite value
MIN_SCALE = 1e-12  # an all-zero row keeps a positive scale (its values quantize to 0)
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada and Hopper on
interpret = False  # tests: `quantize_rows`' Triton kernel on CPU tensors too (TRITON_INTERPRET=1)


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
    y = torch._scaled_mm(xq, wq.T, scale_a=x_scale, scale_b=scale.view(1, -1), out_dtype=out_dtype)
    return y if bias is None else y + bias


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


if triton is not None:

    @triton.jit
    def _quantize_rows_kernel(x_ptr, out_ptr, scale_ptr, stride, K, BLOCK: tl.constexpr):
        """One row per program: its largest |x| / 448 as the scale, x / scale rounded to e4m3 (IEEE divisions, as
        the torch ops': the same bits)."""
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < K
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        triton_ops.store_fp8_row(x, out_ptr + row * K + cols, mask, scale_ptr + row)

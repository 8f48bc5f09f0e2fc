"""Dense stride-1 convolutions as an implicit GEMM on tensor cores, with their epilogues in the same kernel.

- `conv_gemm(x, taps, bias, dilation, padding, snake=, residual=, noise=)`: F.conv1d for groups 1, one Triton
  kernel whose loop runs over the K taps times the input-channel blocks (a tensor-core dot each, the input read
  shifted by the tap's offset), then the bias, a Snake, SNAC's noise factor and a residual add;
- `pointwise_conv1d`: its 1x1 case with a residual add, or SNAC's noise block `x + noise * conv(x)`;
- `tap_weights(conv)`: a convolution's weight re-laid as [K, C_out, C_in] once, kept until the weight changes;
- `gemm_tile`: the launch tile per layer shape, from benchmark/conv_gemm.py's sweeps.

Which convolutions take it is the codecs' policy (`codec_kernels.gemm_convs`). CUDA tensors only; tests run the
kernel on the CPU through Triton's interpreter (tests/triton_checks/check_ops.py).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from vox_serve.rt import triton_ops
from vox_serve.rt.derived import Derived
from vox_serve.rt.triton_ops import unit_last_stride

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton (CPU-only installs): the callers run PyTorch's convolutions
    triton = None

if triton is not None:

    # A stride-1 convolution as an implicit GEMM, one [BLOCK_CO, BLOCK_T] output tile per program (of a batch row):
    # the K taps times the C_IN / BLOCK_K channel blocks are one loop of tensor-core dots (weight [K, C_OUT, C_IN]),
    # each tap reading the input shifted by its offset; epilogues: bias, a Snake, SNAC's noise scale, a residual add.
    # Channels, taps and offsets are compile-time constants (one variant per layer shape); lengths and strides
    # are specialised on (where they divide by 16 the loads and stores are vectorised).
    @triton.jit
    def _conv_gemm_kernel(x_ptr, w_ptr, b_ptr, alpha_ptr, scale_ptr, noise_ptr, res_ptr, out_ptr, length_in, length,
                          x_sb, x_sc, r_sb, r_sc, C_IN: tl.constexpr, C_OUT: tl.constexpr, K: tl.constexpr,
                          DILATION: tl.constexpr, PADDING: tl.constexpr, HAS_BIAS: tl.constexpr, SNAKE: tl.constexpr,
                          NOISE: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_T: tl.constexpr,
                          BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)  # the batch row's base pointers carry the int64 offsets; in a row the
        co = tl.program_id(1) * BLOCK_CO + tl.arange(0, BLOCK_CO)  # offsets are int32 (`conv_gemm` checks)
        t = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)
        co_ok = co < C_OUT  # masks only where the tile overhangs C_OUT (EVEN: none, as vectorisable as before)
        t_ok = t < length
        x_row = x_ptr + b * x_sb
        acc = tl.zeros([BLOCK_CO, BLOCK_T], dtype=tl.float32)
        if K == 1:  # a 1x1 convolution: the plain channel loop (measured faster than the tap loop's indexing)
            for k0 in range(0, C_IN, BLOCK_K):
                ci = k0 + tl.arange(0, BLOCK_K)
                w_at = w_ptr + co[:, None] * C_IN + ci[None, :]
                w = tl.load(w_at) if EVEN else tl.load(w_at, mask=co_ok[:, None], other=0.0)
                h = tl.load(x_row + ci[:, None] * x_sc + t[None, :], mask=t_ok[None, :], other=0.0)
                acc = tl.dot(w, h.to(w.dtype), acc)
        else:
            steps = C_IN // BLOCK_K
            for i in range(K * steps):
                tap = i // steps
                ci = (i % steps) * BLOCK_K + tl.arange(0, BLOCK_K)
                src = t + (tap * DILATION - PADDING)
                src_ok = t_ok & (src >= 0) & (src < length_in) if PADDING else t_ok
                w_at = w_ptr + (tap * C_OUT + co[:, None]) * C_IN + ci[None, :]
                w = tl.load(w_at) if EVEN else tl.load(w_at, mask=co_ok[:, None], other=0.0)
                h = tl.load(x_row + ci[:, None] * x_sc + src[None, :], mask=src_ok[None, :], other=0.0)
                acc = tl.dot(w, h.to(w.dtype), acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + co, mask=co_ok, other=0.0).to(tl.float32)[:, None]
        if SNAKE:  # the Snake after the convolution, on its float32 sums
            alpha = tl.load(alpha_ptr + co, mask=co_ok, other=0.0).to(tl.float32)[:, None]
            acc += tl.load(scale_ptr + co, mask=co_ok, other=0.0).to(tl.float32)[:, None] * triton_ops.sin2(alpha * acc)
        if NOISE:  # SNAC's noise block: res + noise * (W res), noise [B, 1, T] float32
            acc *= tl.load(noise_ptr + b * length + t, mask=t_ok, other=0.0)[None, :]
        ok = t_ok[None, :] if EVEN else co_ok[:, None] & t_ok[None, :]
        if RESIDUAL:
            acc += tl.load(res_ptr + b * r_sb + co[:, None] * r_sc + t[None, :], mask=ok, other=0.0).to(tl.float32)
        out = out_ptr + b * C_OUT * length + co[:, None] * length + t[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class GemmTile:
    """Launch shape of `conv_gemm`: output channels x samples per program, input channels per dot."""

    co: int
    t: int
    k: int
    warps: int = 4
    stages: int | None = None  # software-pipelining depth; None: Triton's default


def gemm_tile(c_in: int, c_out: int, kernel: int, length: int, dtype: torch.dtype) -> GemmTile | None:
    """`conv_gemm`'s tile for a layer, or None where it does not apply (tensor-core dots need the input channels
    in blocks of 16). 1x1 convolutions keep the tile SNAC's were measured with (benchmark/results/h100-2026-12-06b);
    wider kernels the best of benchmark/conv_gemm.py's sweep on an H100 (benchmark/results/h100-2026-12-06c:
    128 x 64 x 64 tiles of 4 warps where the input channels allow blocks of 64, else 128 x 128 x 32, 4 stages)."""
    if c_in % 16 or c_out < 1:
        return None
    k = min(32 if dtype.itemsize > 2 else 64, c_in & -c_in)  # float32 tiles: half the shared memory per stage
    if kernel == 1:
        return GemmTile(co=min(64, max(16, c_out & -c_out)), t=128, k=k) if c_out % 16 == 0 else None
    co = min(128, max(16, triton.next_power_of_2(c_out)))
    t = min(64 if k == 64 else 128, max(16, triton.next_power_of_2(max(length, 1))))
    return GemmTile(co=co, t=t, k=k, warps=4, stages=3 if k == 64 else 4)


def conv_gemm(x: Tensor, taps: Tensor, bias: Tensor | None, dilation: int = 1, padding: int = 0, *,
              snake: tuple[Tensor, Tensor] | None = None, residual: Tensor | None = None,
              noise: Tensor | None = None, tile: GemmTile | None = None) -> Tensor:
    """F.conv1d(x, weight, bias, stride 1, padding, dilation) for groups = 1 as an implicit GEMM on tensor cores,
    with its epilogue in the same kernel: then `snake` = (alpha, scale) (C_out values each, `snake()`'s formula),
    then `noise` [B, 1, T] float32 as a factor (SNAC's noise block), then `+ residual` [B, C_out, T].
    x [B, C_in, L] (any batch and channel strides), `taps` = weight.permute(2, 0, 1) contiguous ([K, C_out, C_in],
    `tap_weights`) -> contiguous [B, C_out, L + 2 padding - dilation (K - 1)] in x's dtype (float32 accumulation;
    float32 operands multiply in TF32, as cuDNN's convolutions do). `tile`: `gemm_tile`'s unless given."""
    x = unit_last_stride(x)
    batch, c_in, length_in = x.shape
    kernel, c_out, _ = taps.shape
    length = length_in + 2 * padding - dilation * (kernel - 1)
    if taps.shape[2] != c_in:
        raise ValueError(f"conv_gemm: taps for {taps.shape[2]} input channels, x has {c_in}")
    tile = tile or gemm_tile(c_in, c_out, kernel, length, x.dtype)
    if tile is None:
        raise ValueError(f"conv_gemm: {c_in} input channels are no multiple of 16")
    if c_in % tile.k:
        raise ValueError(f"conv_gemm: {c_in} input channels are no multiple of the tile's {tile.k} ({tile})")
    res = unit_last_stride(residual) if residual is not None else None
    widest = max(c_in * x.stride(1), c_out * res.stride(1) if res is not None else 0, c_out * max(length, 0))
    if widest >= 2**31:
        raise ValueError(f"conv_gemm: a batch row of {c_in}x{length_in} is past the kernel's int32 offsets")
    out = torch.empty(batch, c_out, max(length, 0), dtype=x.dtype, device=x.device)
    if out.numel():
        alpha, scale = (t.reshape(-1).contiguous() for t in snake) if snake is not None else (taps, taps)
        grid = (batch, triton.cdiv(c_out, tile.co), triton.cdiv(length, tile.t))
        _conv_gemm_kernel[grid](
            x, taps.to(x.dtype), bias if bias is not None else taps, alpha, scale,
            noise.float().contiguous() if noise is not None else taps, res if res is not None else x, out,
            length_in, length, x.stride(0), x.stride(1), res.stride(0) if res is not None else 0,
            res.stride(1) if res is not None else 0, C_IN=c_in, C_OUT=c_out, K=kernel, DILATION=dilation,
            PADDING=padding, HAS_BIAS=bias is not None, SNAKE=snake is not None, NOISE=noise is not None,
            RESIDUAL=res is not None, BLOCK_CO=tile.co, BLOCK_T=tile.t, BLOCK_K=tile.k, EVEN=c_out % tile.co == 0,
            num_warps=tile.warps, **({"num_stages": tile.stages} if tile.stages else {}))
    return out


def pointwise_conv1d(h: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor,
                     noise: Tensor | None = None) -> Tensor:
    """A 1x1 convolution with its epilogue in one kernel (`conv_gemm`): residual + (weight h + bias), or with
    `noise` [B, 1, T] (float32) SNAC's noise block residual + noise * (weight h). h [B, C_in, T], weight
    [C_out, C_in, 1], residual [B, C_out, T] (pass h again for the noise block)."""
    c_out, c_in, _ = weight.shape
    return conv_gemm(h, weight.reshape(1, c_out, c_in), bias, residual=residual, noise=noise)


_taps: dict[int, Derived] = {}  # by id(weight); an entry goes with its weight (tensors are no weak keys: their
# == is elementwise)


def tap_weights(conv: torch.nn.Conv1d) -> Tensor:
    """conv.weight as `conv_gemm` reads it, [K, C_out, C_in], kept until the weight changes."""
    key = id(conv.weight)
    derived = _taps.get(key)
    if derived is None:
        derived = _taps[key] = Derived(lambda w: (w.permute(2, 0, 1).contiguous(),))
        weakref.finalize(conv.weight, _taps.pop, key, None)
    return derived.get(conv.weight)[0]

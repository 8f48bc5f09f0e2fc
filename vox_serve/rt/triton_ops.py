"""Fused Triton kernels for the per-step hot spots, with the plain PyTorch code as their reference.

A decode step of a 3B model launched ~1,600 kernels, most of them tiny elementwise ops: at batch 1
their launch gaps cost as much device time as the weight reads. Each kernel here replaces a chain
of such ops with one pass:

- `hash_uniform`: the counter-based RNG of `rt.kernels` (~60 int64 ops per call) -> 1 kernel,
  bit-identical (uint32 arithmetic wraps exactly like the reference's masked int64 arithmetic);
- `snake`: the codecs' Snake activation `x + scale sin(alpha x)^2` (5 passes over the activations) -> 1;
- `rope`: rotate-half rotary embedding of q or k from the cos/sin tables (~8 ops) -> 1.

Used only for CUDA tensors when Triton imports (`enabled(t)`); everything else runs the reference.
Tests run these kernels on the CPU through Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton (CPU-only installs): the reference ops run instead
    triton = None

_BLOCK = 1024


def enabled(t: Tensor) -> bool:
    """Whether the fused kernels serve tensors like `t`: CUDA tensors, when Triton imports.

    (Tests call the kernels directly on CPU tensors under TRITON_INTERPRET=1.)"""
    return triton is not None and t.is_cuda


if triton is not None:

    @triton.jit
    def _fmix32(h):
        h = h ^ (h >> 16)
        h = h * 0x85EBCA6B
        h = h ^ (h >> 13)
        h = h * 0xC2B2AE35
        return h ^ (h >> 16)

    @triton.jit
    def _mix_word(key, word):
        return _fmix32((key ^ word) * 0x9E3779B9 ^ 0x7F4A7C15)

    # Sizes and strides are not specialised on (Triton would compile a variant per divisibility class):
    # one compiled kernel per dtype, built while the stages are warmed up and captured at start-up.
    @triton.jit(do_not_specialize=["total", "n", "salt"])
    def _hash_uniform_kernel(seed_ptr, offset_ptr, out_ptr, total, n, salt, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < total
        row = i // n
        col = (i % n).to(tl.uint32)
        seed = tl.load(seed_ptr + row, mask=mask, other=0)
        offset = tl.load(offset_ptr + row, mask=mask, other=0)
        key = (tl.zeros_like(col).to(tl.int64) + salt).to(tl.uint32)  # salts above 2**31 arrive as int64
        key = _mix_word(key, (seed & 0xFFFFFFFF).to(tl.uint32))
        key = _mix_word(key, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
        key = _mix_word(key, (offset & 0xFFFFFFFF).to(tl.uint32))
        key = _mix_word(key, ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32))
        h = _fmix32(key + col * 0x9E3779B9)
        bits = _fmix32(h ^ key)
        u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        tl.store(out_ptr + i, u, mask=mask)

    @triton.jit(do_not_specialize=["total", "channels", "length"])
    def _snake_kernel(x_ptr, alpha_ptr, scale_ptr, out_ptr, total, channels, length, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < total
        c = (i // length) % channels
        x = tl.load(x_ptr + i, mask=mask, other=0.0).to(tl.float32)
        a = tl.load(alpha_ptr + c, mask=mask, other=1.0).to(tl.float32)
        scale = tl.load(scale_ptr + c, mask=mask, other=1.0).to(tl.float32)
        s = tl.sin(a * x)
        y = x + scale * s * s
        tl.store(out_ptr + i, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["heads", "stride_t", "stride_h", "table_stride"])
    def _rope_kernel(x_ptr, out_ptr, cos_ptr, sin_ptr, pos_ptr, heads, stride_t, stride_h, table_stride,
                     HALF: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        d = tl.arange(0, HALF)
        pos = tl.load(pos_ptr + t)
        src = x_ptr + t * stride_t + h * stride_h
        x1 = tl.load(src + d).to(tl.float32)
        x2 = tl.load(src + HALF + d).to(tl.float32)
        cos = tl.load(cos_ptr + pos * table_stride + d)
        sin = tl.load(sin_ptr + pos * table_stride + d)
        dst = out_ptr + (t * heads + h) * (2 * HALF)
        tl.store(dst + d, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty))
        tl.store(dst + HALF + d, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty))


def _grid(total: int) -> tuple[int]:
    return (triton.cdiv(total, _BLOCK),)


def hash_uniform(seed: Tensor, offset: Tensor, n: int, salt: int) -> Tensor:
    """`rt.kernels` uniforms for one salt: seed, offset [N] int64 -> [N, n] float32."""
    rows = seed.shape[0]
    out = torch.empty(rows, n, dtype=torch.float32, device=seed.device)
    total = rows * n
    if total:
        _hash_uniform_kernel[_grid(total)](seed.to(torch.int64).contiguous(), offset.to(torch.int64).contiguous(),
                                           out, total, n, salt, BLOCK=_BLOCK)
    return out


def snake(x: Tensor, alpha: Tensor, scale: Tensor) -> Tensor:
    """x [B, C, T]; alpha, scale: C values -> x + scale * sin(alpha x)^2 in x's dtype (math in float32).

    SNAC's Snake has scale = 1 / (alpha + 1e-9); the Qwen3 codec's SnakeBeta its own per-channel scale."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _, channels, length = x.shape
    if x.numel():
        _snake_kernel[_grid(x.numel())](x, alpha.reshape(-1).contiguous(), scale.reshape(-1).contiguous(), out,
                                        x.numel(), channels, length, BLOCK=_BLOCK)
    return out


def rope(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor) -> Tensor:
    """Rotate-half rope: x [T, H, D] (any strides with a unit last stride), cos/sin tables [P, D]
    float32 whose two halves are equal, positions [T] -> new contiguous [T, H, D] in x's dtype."""
    tokens, heads, dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(tokens, heads, dim, dtype=x.dtype, device=x.device)
    if tokens and heads:
        _rope_kernel[(tokens, heads)](x, out, cos, sin, positions, heads, x.stride(0), x.stride(1), cos.stride(0),
                                      HALF=dim // 2)
    return out

"""A depth transformer's attention step in one Triton kernel: the q/k preparation (Qwen3's per-head RMSNorm, the
rope), the write of the new K/V into the static cache, and causal attention over the row's positions.

A depth transformer (`layers/depth.py`: Qwen3-TTS's code predictor, CSM's depth decoder) attends over at most a
few dozen positions per row, so its attention is all latency: the unfused step is `triton_ops.rope_write_kv`
(one launch) and PyTorch's scaled_dot_product_attention over the static cache (one cuDNN launch of ~3.4 us on an
H200 for Qwen3-TTS's predictor at one row), 75 of each per Qwen3-TTS frame. Here one program per (row, KV head)
prepares and writes the row's new keys and values, then attends the head's query heads at each new position over
the row's cache, whose positions past the query's hold another frame's values and are masked out.

`attend(q, k, v, k_cache, v_cache, slots, positions, ...)` -> [T, Hq, D] in q's dtype, T = rows * n (row r's
new positions are tokens r * n .. r * n + n - 1, their positions in `positions`, their cache slots in `slots`,
written by `triton_ops`' KV store); q and k prepared as
`triton_ops.rope_write_kv` prepares them (q rounded to its dtype after the rope), softmax in float32 over the
float32 products, the output rounded to q's dtype. Returns None where the kernel does not serve (no Triton, a
non-CUDA tensor, more than MAX_POSITIONS positions) and unless `VOX_DEPTH_ATTENTION=1`; the caller then runs its
PyTorch path. Off by default: on an H200 (benchmark/results/h200-2026-12-03c) the Qwen3-TTS frame took 4.078 ->
4.055 ms at 1 row and 5.974 -> 5.907 ms at 16 with it, but 3.794 -> 3.780 and 5.938 -> 6.196 ms once the step's
kernels use programmatic dependent launch (rt/pdl.py); why it loses at 16 rows there is not established.
Tests run it through Triton's interpreter on the CPU (`forced`).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from vox_serve.rt import pdl, triton_ops

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton: the caller's PyTorch path runs
    triton = None

MAX_POSITIONS = 64  # a row's whole cache is one [positions, head dim] tile per program
forced = False  # tests: serve any tensors (CPU ones through Triton's interpreter), the switch aside


def serves(q: Tensor, k_cache: Tensor) -> bool:
    on = forced or (triton_ops.enabled(q) and os.environ.get("VOX_DEPTH_ATTENTION", "0") == "1")
    if triton is None or not on:
        return False
    return k_cache.is_contiguous() and k_cache.shape[1] <= MAX_POSITIONS and q.shape[-1] % 2 == 0


def attend(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, positions: Tensor, *,
           rows: int, cos: Tensor, sin: Tensor, q_norm: Tensor | None = None, k_norm: Tensor | None = None,
           eps: float = 0.0) -> Tensor | None:
    """q [T, Hq, D], k, v [T, Hkv, D] (unit last strides), caches [max rows, positions, Hkv, D] contiguous,
    slots [T] (token t of row r at position p: r * positions + p), positions [T] (T = rows * n, each row's n
    positions alike); see the module docstring."""
    if not serves(q, k_cache):
        return None
    tokens, q_heads, dim = q.shape
    kv_heads = k.shape[1]
    n = tokens // rows
    if n * rows != tokens or v_cache.shape != k_cache.shape or k_cache.shape[2:] != (kv_heads, dim):
        raise ValueError(f"depth attention: {tokens} tokens over {rows} rows, caches {tuple(k_cache.shape)}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("depth attention: q_norm and k_norm go together")
    q, k, v = (triton_ops.unit_last_stride(x) for x in (q, k, v))
    out = torch.empty(tokens, q_heads, dim, dtype=q.dtype, device=q.device)
    if not tokens:
        return out
    half, num_positions = dim // 2, k_cache.shape[1]
    weights = (q_norm, k_norm) if q_norm is not None else (cos, cos)  # (unread without the norm)
    _depth_attention_kernel[(rows, kv_heads)](
        q, k, v, out, k_cache, v_cache, slots, positions, cos, sin, *weights, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), cos.stride(0), dim ** -0.5, eps, N=n, G=q_heads // kv_heads,
        HKV=kv_heads, POSITIONS=num_positions, P_PAD=triton.next_power_of_2(num_positions),
        HAS_NORM=q_norm is not None, HALF=half, BLOCK=triton.next_power_of_2(half), num_warps=4,
        **pdl.launch_options(q))
    return out


if triton is not None:
    from vox_serve.rt.triton_ops import _norm_rotate, _store_kv

    @triton.jit
    def _tile(ptr, rows, d, mask, HALF: tl.constexpr):
        """A cache's [P_PAD, BLOCK] halves of positions p at offsets `rows` (float32)."""
        at = rows[:, None] + d[None, :]
        return tl.load(ptr + at, mask=mask, other=0.0).to(tl.float32), \
            tl.load(ptr + at + HALF, mask=mask, other=0.0).to(tl.float32)

    @triton.jit(do_not_specialize=["sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "table_stride", "scale", "eps"])
    def _depth_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, kc_ptr, vc_ptr, slot_ptr, pos_ptr, cos_ptr, sin_ptr,
                                qw_ptr, kw_ptr, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, table_stride, scale, eps,
                                N: tl.constexpr, G: tl.constexpr, HKV: tl.constexpr, POSITIONS: tl.constexpr,
                                P_PAD: tl.constexpr, HAS_NORM: tl.constexpr, HALF: tl.constexpr,
                                BLOCK: tl.constexpr, PDL: tl.constexpr):
        pdl.enter(PDL)
        r = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        d = tl.arange(0, BLOCK)
        dmask = d < HALF
        row_base = r * (POSITIONS * HKV * 2 * HALF) + h * (2 * HALF)
        # The row's new keys (prepared as rope_write_kv prepares them, rounded to k's dtype) and values.
        for j in tl.static_range(N):
            t = r * N + j
            pos = tl.load(pos_ptr + t).to(tl.int64)
            cos = tl.load(cos_ptr + pos * table_stride + d, mask=dmask, other=0.0)
            sin = tl.load(sin_ptr + pos * table_stride + d, mask=dmask, other=0.0)
            y1, y2 = _norm_rotate(k_ptr + t * sk_t + h * sk_h, kw_ptr, cos, sin, d, dmask, eps, HAS_NORM, HALF)
            # the static cache's rows as pages of POSITIONS tokens, as rope_write_kv writes it
            _store_kv(kc_ptr, vc_ptr, slot_ptr, v_ptr + t * sv_t + h * sv_h, t, h, y1.to(k_ptr.dtype.element_ty),
                      y2.to(k_ptr.dtype.element_ty), d, dmask, POSITIONS, POSITIONS * HKV * 2 * HALF, HKV * 2 * HALF,
                      2 * HALF, HALF, False)  # (a cache in the model's dtype: nothing to saturate)
        tl.debug_barrier()  # the writes above are read back below by other threads of the program
        p = tl.arange(0, P_PAD)
        tile_mask = (p < POSITIONS)[:, None] & dmask[None, :]
        rows = row_base + p.to(tl.int64) * (HKV * 2 * HALF)
        k1, k2 = _tile(kc_ptr, rows, d, tile_mask, HALF)
        v1, v2 = _tile(vc_ptr, rows, d, tile_mask, HALF)
        for j in tl.static_range(N):
            t = r * N + j
            pos = tl.load(pos_ptr + t).to(tl.int64)
            cos = tl.load(cos_ptr + pos * table_stride + d, mask=dmask, other=0.0)
            sin = tl.load(sin_ptr + pos * table_stride + d, mask=dmask, other=0.0)
            for g in tl.static_range(G):
                head = h * G + g
                y1, y2 = _norm_rotate(q_ptr + t * sq_t + head * sq_h, qw_ptr, cos, sin, d, dmask, eps, HAS_NORM,
                                      HALF)
                y1 = y1.to(q_ptr.dtype.element_ty).to(tl.float32)  # as the rotated q that the unfused path keeps
                y2 = y2.to(q_ptr.dtype.element_ty).to(tl.float32)
                s = tl.sum(k1 * y1[None, :], axis=1) + tl.sum(k2 * y2[None, :], axis=1)
                s = tl.where(p <= pos, s * scale, float("-inf"))  # past the query: another frame's positions
                e = tl.exp(s - tl.max(s, axis=0))
                inv = 1.0 / tl.sum(e, axis=0)
                dst = out_ptr + (t * (HKV * G) + head) * (2 * HALF)
                tl.store(dst + d, (tl.sum(e[:, None] * v1, axis=0) * inv).to(out_ptr.dtype.element_ty), mask=dmask)
                tl.store(dst + HALF + d, (tl.sum(e[:, None] * v2, axis=0) * inv).to(out_ptr.dtype.element_ty),
                         mask=dmask)

"""Fused Triton kernels for the per-step hot spots, with the plain PyTorch code as their reference.

A decode step of a 3B model launched ~1,600 kernels, most of them tiny elementwise ops: at batch 1
their launch gaps cost as much device time as the weight reads. Each kernel here replaces a chain
of such ops with one pass:

- `hash_uniform`: the counter-based RNG of `rt.kernels` (~60 int64 ops per call) -> 1 kernel,
  bit-identical (uint32 arithmetic wraps exactly like the reference's masked int64 arithmetic);
- `rope`: rotate-half rotary embedding of q or k from the cos/sin tables (~8 ops) -> 1;
- `sample`: the sampling filters (temperature, top-k, top-p, min-p) and the draw (~40 ops) -> 1;
- `silu_mul`: the SwiGLU gate `silu(gate) * up` of a fused gate/up projection (2 kernels) -> 1;
- `add_rms_norm`: a residual add and the RMSNorm after it (2 kernels) -> 1, returning both;
- `add_rms_norm_fp8`, `silu_mul_fp8`: the same with their output quantized per row to float8 for the float8 GEMM
  after them (`--quantization fp8`; `rt/fp8_gemm.quantize_rows` is the launch they save);
- `rope_write_kv`: an attention layer's q/k rope (and Qwen3's per-head q/k RMSNorm) and the K/V cache write at
  the tokens' slots (2 rope launches, 2 norms, `//`, `%` and 2 index_put kernels) -> 1; into a float8 cache
  the values are clamped to its finite range first, as `kv_write.to_cache` does.

Used only for CUDA tensors when Triton imports (`enabled(t)`); everything else runs the reference.
The codecs' kernels (Snake, convolutions) are in `rt/codec_kernels.py`.
Tests run these kernels on the CPU through Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from vox_serve.rt import pdl

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton (CPU-only installs): the reference ops run instead
    triton = None

_BLOCK = 1024
FP8 = torch.float8_e4m3fn  # float8 e4m3: the one float8 format (KV cache, weights, GEMM rows)
MAX_SAMPLE_VOCAB = 8192  # the fused sampler sorts a row in one program (ids fit 13 bits of its sort key)


def unit_last_stride(x: Tensor) -> Tensor:
    """x itself where its last stride is 1 (what the kernels index by), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def enabled(t: Tensor) -> bool:
    """Whether the fused kernels serve tensors like `t`: CUDA tensors, when Triton imports.

    (Tests call the kernels directly on CPU tensors under TRITON_INTERPRET=1.)"""
    return triton is not None and t.is_cuda


def switched_on(t: Tensor, forced: bool | None, env: str, default_on: bool) -> bool:
    """Whether an optional fused kernel serves tensors like `t`: `forced` where a test sets it (True: any tensor,
    CPU ones through Triton's interpreter; False: none), else `enabled(t)` with the switch `env` on (unset: as
    `default_on` says; set, on unless "0" for a kernel on by default, only at "1" for one off by default)."""
    if triton is None:
        return False
    if forced is not None:
        return forced
    value = os.environ.get(env)
    on = default_on if value is None else (value != "0" if default_on else value == "1")
    return on and enabled(t)


if triton is not None:

    @triton.jit
    def sin2(z):
        """sin(z)^2 in float32 (the Snake activations' term) from FMAs: z less the nearest multiple of pi (sin^2
        has period pi, so no sign to track; pi in three parts, exact products for |z| < 4096 pi) is within pi/2,
        where sin's Taylor series to z^11 is off by < 6e-8. libdevice's sinf made the Snake passes compute-bound
        in bfloat16."""
        k = tl.floor(z * 0.3183098861837907 + 0.5)
        r = z - k * 3.140625
        r = r - k * 0.0009677410125732422
        r = r + k * 8.742277657347586e-08
        r2 = r * r
        p = r2 * -2.505210838544172e-08 + 2.7557319223985893e-06
        p = p * r2 - 0.0001984126984126984
        p = p * r2 + 0.008333333333333333
        p = p * r2 - 0.16666666666666666
        s = r + r * r2 * p
        return s * s

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

    @triton.jit(do_not_specialize=["total", "width"])
    def _silu_mul_kernel(x_ptr, out_ptr, total, width, BLOCK: tl.constexpr, PDL: tl.constexpr):
        pdl.enter(PDL)
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < total
        row, col = i // width, i % width
        gate = tl.load(x_ptr + row * (2 * width) + col, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * (2 * width) + width + col, mask=mask, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + i, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def store_fp8_row(y, dst, mask, scale_ptr):
        """A row y [BLOCK] (float32, 0 where masked) stored as float8 e4m3 at `dst` (pointers) with one scale at
        `scale_ptr`: its largest |y| / 448, at least 1e-12; the quotients saturated (IEEE divisions: the bits of
        rt/fp8_gemm's torch reference)."""
        scale = tl.maximum(tl.div_rn(tl.max(tl.abs(y), axis=0), 448.0), 1e-12)
        q = tl.minimum(tl.maximum(tl.div_rn(y, scale), -448.0), 448.0)
        tl.store(dst, q.to(dst.dtype.element_ty), mask=mask)
        tl.store(scale_ptr, scale)

    @triton.jit(do_not_specialize=["width"])
    def _silu_mul_fp8_kernel(x_ptr, out_ptr, scale_ptr, width, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """One row per program: silu(gate) * up rounded to the input's dtype (as `_silu_mul_kernel` stores it),
        then quantized to float8 with the row's scale."""
        pdl.enter(PDL)
        row = tl.program_id(0).to(tl.int64)
        col = tl.arange(0, BLOCK)
        mask = col < width
        gate = tl.load(x_ptr + row * (2 * width) + col, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * (2 * width) + width + col, mask=mask, other=0.0).to(tl.float32)
        y = (gate / (1.0 + tl.exp(-gate)) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
        store_fp8_row(y, out_ptr + row * width + col, mask, scale_ptr + row)

    @triton.jit(do_not_specialize=["width", "eps"])
    def _add_rms_norm_kernel(x_ptr, delta_ptr, weight_ptr, sum_ptr, out_ptr, scale_ptr, width, eps,
                             BLOCK: tl.constexpr, FP8: tl.constexpr, PDL: tl.constexpr):
        """`FP8`: the normed row, rounded to x's dtype, stored quantized to float8 (`store_fp8_row`)."""
        pdl.enter(PDL)
        row = tl.program_id(0).to(tl.int64)
        col = tl.arange(0, BLOCK)
        mask = col < width
        x = tl.load(x_ptr + row * width + col, mask=mask, other=0.0)
        d = tl.load(delta_ptr + row * width + col, mask=mask, other=0.0)
        s = (x.to(tl.float32) + d.to(tl.float32)).to(sum_ptr.dtype.element_ty)  # rounded as the residual is
        tl.store(sum_ptr + row * width + col, s, mask=mask)
        sf = s.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / width + eps)
        w = tl.load(weight_ptr + col, mask=mask, other=0.0).to(tl.float32)
        y = (sf * inv * w).to(sum_ptr.dtype.element_ty)
        if FP8:
            store_fp8_row(y.to(tl.float32), out_ptr + row * width + col, mask, scale_ptr + row)
        else:
            tl.store(out_ptr + row * width + col, y.to(out_ptr.dtype.element_ty), mask=mask)

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

    @triton.jit
    def _norm_rotate(src, w_ptr, cos, sin, d, mask, eps, HAS_NORM: tl.constexpr, HALF: tl.constexpr):
        """One head's halves (x1, x2), per-head RMSNorm'd when HAS_NORM (rounded to the input dtype, as the
        unfused norm's output is), rotated: float32 (y1, y2)."""
        x1 = tl.load(src + d, mask=mask, other=0.0)
        x2 = tl.load(src + HALF + d, mask=mask, other=0.0)
        if HAS_NORM:
            f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
            inv = 1.0 / tl.sqrt((tl.sum(f1 * f1, axis=0) + tl.sum(f2 * f2, axis=0)) / (2 * HALF) + eps)
            w1 = tl.load(w_ptr + d, mask=mask, other=0.0).to(tl.float32)
            w2 = tl.load(w_ptr + HALF + d, mask=mask, other=0.0).to(tl.float32)
            x1, x2 = (f1 * inv * w1).to(x1.dtype), (f2 * inv * w2).to(x2.dtype)
        x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
        return x1 * cos - x2 * sin, x2 * cos + x1 * sin

    @triton.jit
    def _cached(x, ptr, SATURATE: tl.constexpr):
        """x in the cache's dtype; SATURATE (a float8 e4m3 cache): clamped to its finite range (+-448) first."""
        if SATURATE:
            x = tl.minimum(tl.maximum(x.to(tl.float32), -448.0), 448.0)
        return x.to(ptr.dtype.element_ty)

    @triton.jit
    def _store_kv(kc_ptr, vc_ptr, slot_ptr, v_src, t, kh, y1, y2, d, mask, page_size, c_page, c_tok, c_head,
                  HALF: tl.constexpr, SATURATE: tl.constexpr):
        """k halves (y1, y2) and the v head at v_src into the caches at token t's slot (page = slot // page_size)."""
        slot = tl.load(slot_ptr + t).to(tl.int64)
        at = (slot // page_size) * c_page + (slot % page_size) * c_tok + kh * c_head
        tl.store(kc_ptr + at + d, _cached(y1, kc_ptr, SATURATE), mask=mask)
        tl.store(kc_ptr + at + HALF + d, _cached(y2, kc_ptr, SATURATE), mask=mask)
        tl.store(vc_ptr + at + d, _cached(tl.load(v_src + d, mask=mask), vc_ptr, SATURATE), mask=mask)
        tl.store(vc_ptr + at + HALF + d, _cached(tl.load(v_src + HALF + d, mask=mask), vc_ptr, SATURATE), mask=mask)

    # One program per (token, head). Rotating, heads [0, q_heads) rotate a q head into q_out and the others a
    # k head; each k head goes into the cache with its v head. Without ROTATE, q_heads is 0 (a plain KV write).
    @triton.jit(do_not_specialize=["q_heads", "sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "table_stride",
                                   "page_size", "c_page", "c_tok", "c_head", "eps"])
    def _rope_write_kv_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, kc_ptr, vc_ptr, slot_ptr, pos_ptr, cos_ptr, sin_ptr,
                              qw_ptr, kw_ptr, q_heads, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, table_stride,
                              page_size, c_page, c_tok, c_head, eps, ROTATE: tl.constexpr,
                              HAS_NORM: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
                              SATURATE: tl.constexpr, PDL: tl.constexpr):
        pdl.enter(PDL)
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        d = tl.arange(0, BLOCK)
        mask = d < HALF
        kh = h - q_heads
        if ROTATE:
            pos = tl.load(pos_ptr + t).to(tl.int64)
            cos = tl.load(cos_ptr + pos * table_stride + d, mask=mask, other=0.0)
            sin = tl.load(sin_ptr + pos * table_stride + d, mask=mask, other=0.0)
            if h < q_heads:
                y1, y2 = _norm_rotate(q_ptr + t * sq_t + h * sq_h, qw_ptr, cos, sin, d, mask, eps, HAS_NORM, HALF)
                dst = q_out_ptr + (t * q_heads + h) * (2 * HALF)
                tl.store(dst + d, y1.to(q_out_ptr.dtype.element_ty), mask=mask)
                tl.store(dst + HALF + d, y2.to(q_out_ptr.dtype.element_ty), mask=mask)
            else:
                y1, y2 = _norm_rotate(k_ptr + t * sk_t + kh * sk_h, kw_ptr, cos, sin, d, mask, eps, HAS_NORM, HALF)
                # rounded to k's dtype first, as the rotated k that the unfused path writes is
                _store_kv(kc_ptr, vc_ptr, slot_ptr, v_ptr + t * sv_t + kh * sv_h, t, kh,
                          y1.to(k_ptr.dtype.element_ty), y2.to(k_ptr.dtype.element_ty), d, mask,
                          page_size, c_page, c_tok, c_head, HALF, SATURATE)
        else:
            src = k_ptr + t * sk_t + kh * sk_h
            _store_kv(kc_ptr, vc_ptr, slot_ptr, v_ptr + t * sv_t + kh * sv_h, t, kh, tl.load(src + d, mask=mask),
                      tl.load(src + HALF + d, mask=mask), d, mask, page_size, c_page, c_tok, c_head, HALF,
                      SATURATE)

    @triton.jit
    def _hash_key(seed, offset, salt):
        """The per-(seed, offset) key of `_hash_uniform_kernel`, for scalars."""
        key = (tl.zeros([1], dtype=tl.int64) + salt).to(tl.uint32)
        key = _mix_word(key, (seed & 0xFFFFFFFF).to(tl.uint32))
        key = _mix_word(key, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
        key = _mix_word(key, (offset & 0xFFFFFFFF).to(tl.uint32))
        return _mix_word(key, ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32))

    @triton.jit(do_not_specialize=["vocab", "salt"])
    def _sample_kernel(logits_ptr, allowed_ptr, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, offset_ptr,
                       out_ptr, vocab, salt, HAS_ALLOWED: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.arange(0, BLOCK)
        valid = col < vocab
        x = tl.load(logits_ptr + row * vocab + col, mask=valid, other=float("-inf")).to(tl.float32)
        if HAS_ALLOWED:
            ok = tl.load(allowed_ptr + row * vocab + col, mask=valid, other=0)
            x = tl.where(ok != 0, x, float("-inf"))
        temperature = tl.load(temp_ptr + row)
        greedy = temperature <= 0.0
        z = x / tl.where(greedy, 1.0, temperature)
        # Sort by value, descending, ties by ascending id (the reference's stable sort): one int64 key per
        # token, the order-preserving float bits inverted above the id's 13 bits (vocabularies <= 8192).
        bits = z.to(tl.uint32, bitcast=True)
        order = tl.where((bits & 0x80000000) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)
        keys = tl.sort((order ^ 0xFFFFFFFF).to(tl.int64) * 8192 + col.to(tl.int64))
        ids = (keys % 8192).to(tl.int32)
        order = (keys // 8192).to(tl.uint32) ^ 0xFFFFFFFF
        sorted_bits = tl.where((order & 0x80000000) != 0, order & 0x7FFFFFFF, order ^ 0xFFFFFFFF)
        sorted_z = sorted_bits.to(tl.float32, bitcast=True)
        e = tl.exp(sorted_z - tl.max(sorted_z, axis=0))
        probs = e / tl.sum(e, axis=0)
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        keep = col < tl.where(top_k <= 0, BLOCK, top_k)
        mass_k = tl.sum(tl.where(keep, probs, 0.0), axis=0)
        mass_before = tl.cumsum(probs, axis=0) - probs
        keep = keep & (mass_before < tl.where(top_p >= 1.0, float("inf"), top_p * mass_k))
        keep = keep & (probs >= tl.load(min_p_ptr + row) * tl.max(probs, axis=0))
        keep = tl.where(greedy, col == 0, keep | (col == 0))
        kept = tl.where(keep, probs, 0.0)
        kept = kept / tl.sum(kept, axis=0)
        key = _hash_key(tl.load(seed_ptr + row), tl.load(offset_ptr + row), salt)
        h = _fmix32(key + ids.to(tl.uint32) * 0x9E3779B9)
        u = ((_fmix32(h ^ key) >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        score = kept / -tl.log(u)
        best = tl.max(score, axis=0)
        # Among equal scores the lowest id wins, as the reference's argmax over ids does.
        winner = tl.min(tl.where(score == best, ids, 2147483647), axis=0)
        tl.store(out_ptr + row, winner.to(tl.int64))


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


def rope_write_kv(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor, *,
                  cos: Tensor | None = None, sin: Tensor | None = None, positions: Tensor | None = None,
                  q_norm: Tensor | None = None, k_norm: Tensor | None = None, eps: float = 0.0) -> Tensor:
    """Rotate q and k (rotate-half, cos/sin tables [P, D] float32, positions [T]), each head RMSNorm'd first
    when q_norm/k_norm [D] are given (Qwen3), and write the rotated k and v into the caches: one launch.

    q [T, Hq, D], k, v [T, Hkv, D]: any strides with a unit last one (views of a fused qkv output).
    k_cache, v_cache [pages, page_size, Hkv, D] with heads and dims contiguous, any page and token strides
    (the halves of a paged NHD cache, or a static cache's rows as pages); token i goes to page
    slots[i] // page_size, offset slots[i] % page_size. Returns the rotated q as a new contiguous tensor in q's
    dtype; without tables nothing is rotated (a plain KV write) and q itself comes back."""
    rotate = cos is not None
    if rotate and (sin is None or positions is None):
        raise ValueError("rope_write_kv: cos, sin and positions go together")
    if (q_norm is None) != (k_norm is None) or (q_norm is not None and not rotate):
        raise ValueError("rope_write_kv: q_norm and k_norm go together, with the rope tables")
    tokens, q_heads, dim = q.shape
    kv_heads = k.shape[1]
    if dim % 2 or k_cache.shape[1:] != v_cache.shape[1:] or k_cache.shape[2:] != (kv_heads, dim):
        raise ValueError(f"rope_write_kv: caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)} do not hold "
                         f"{kv_heads} heads of even dim {dim}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride()[2:] != (dim, 1):
        raise ValueError("rope_write_kv: the caches need equal strides and contiguous heads")
    q, k, v = (unit_last_stride(x) for x in (q, k, v))
    q_out = torch.empty(tokens, q_heads, dim, dtype=q.dtype, device=q.device) if rotate else q
    if not tokens:
        return q_out
    half = dim // 2
    table = cos if rotate else slots  # (unread without ROTATE: any tensor stands in for the pointers)
    weights = (q_norm, k_norm) if q_norm is not None else (table, table)
    heads = q_heads if rotate else 0
    _rope_write_kv_kernel[(tokens, heads + kv_heads)](
        q, k, v, q_out, k_cache, v_cache, slots, positions if rotate else slots, table, sin if rotate else table,
        *weights, heads, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        table.stride(0), k_cache.shape[1], k_cache.stride(0), k_cache.stride(1), dim, eps,
        ROTATE=rotate, HAS_NORM=q_norm is not None, HALF=half, BLOCK=triton.next_power_of_2(half),
        SATURATE=k_cache.element_size() == 1, num_warps=1, **pdl.launch_options(q))
    return q_out


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up [..., 2I] (gate, then up) -> silu(gate) * up [..., I] in its dtype (math in float32)."""
    gate_up = gate_up.contiguous()
    width = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], width, dtype=gate_up.dtype, device=gate_up.device)
    if out.numel():
        _silu_mul_kernel[_grid(out.numel())](gate_up, out, out.numel(), width, BLOCK=_BLOCK,
                                             **pdl.launch_options(out))
    return out


def add_rms_norm(x: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(x + delta, RMSNorm(x + delta) * weight) for x, delta [T, D]: the sum rounded to x's dtype (as a residual
    stream is), the norm's math in float32 over that sum, the result in x's dtype; one program per row."""
    total, out, _ = _add_rms_norm(x, delta, weight, eps, fp8=False)
    return total, out


def add_rms_norm_fp8(x: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(x + delta, q, scale) for x, delta [T, D]: `add_rms_norm`'s normed rows quantized per row as
    `fp8_gemm.quantize_rows` does (float8 e4m3 [T, D], float32 scales [T, 1]), in the same launch."""
    return _add_rms_norm(x, delta, weight, eps, fp8=True)


def _add_rms_norm(x: Tensor, delta: Tensor, weight: Tensor, eps: float, fp8: bool
                  ) -> tuple[Tensor, Tensor, Tensor | None]:
    x, delta = x.contiguous(), delta.contiguous()  # any leading dimensions: rows of the last one
    width = x.shape[-1]
    tokens = x.numel() // width if width else 0
    total = torch.empty_like(x)
    out = torch.empty(x.shape, dtype=FP8 if fp8 else x.dtype, device=x.device)
    scale = torch.empty(tokens, 1, dtype=torch.float32, device=x.device) if fp8 else None
    if tokens:  # without FP8 the kernel never touches scale_ptr: `total` stands in
        _add_rms_norm_kernel[(tokens,)](x, delta, weight.contiguous(), total, out, total if scale is None else scale,
                                        width, eps,
                                        BLOCK=triton.next_power_of_2(width), FP8=fp8, **pdl.launch_options(x))
    return total, out, scale


def silu_mul_fp8(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """gate_up [T, 2I] -> `silu_mul(gate_up)` quantized per row as `fp8_gemm.quantize_rows` does: (float8 e4m3
    [T, I], float32 scales [T, 1]), one program per row."""
    gate_up = gate_up.contiguous()
    rows, width = gate_up.shape[0], gate_up.shape[-1] // 2
    out = torch.empty(rows, width, dtype=FP8, device=gate_up.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=gate_up.device)
    if rows:
        block = triton.next_power_of_2(width)
        _silu_mul_fp8_kernel[(rows,)](gate_up, out, scale, width, BLOCK=block, num_warps=8 if block >= 4096 else 4,
                                      **pdl.launch_options(gate_up))
    return out, scale


def sample(logits: Tensor, allowed: Tensor | None, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor,
           seed: Tensor, offset: Tensor, salt: int) -> Tensor:
    """`rt.kernels.sample` after its repetition penalty, one program per row: logits [N, V] (V <= 8192)
    -> [N] int64. The same filters and exponential race over the same hash uniforms; probabilities
    may differ from the reference's in the last bits (exp), so near-tied draws can differ."""
    rows, vocab = logits.shape
    if vocab > MAX_SAMPLE_VOCAB:
        raise ValueError(f"the fused sampler takes vocabularies up to {MAX_SAMPLE_VOCAB} ids, not {vocab}")
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        block = triton.next_power_of_2(vocab)
        _sample_kernel[(rows,)](
            logits.float().contiguous(), allowed.contiguous() if allowed is not None else logits,
            temperature.float().contiguous(), top_k.to(torch.int64).contiguous(), top_p.float().contiguous(),
            min_p.float().contiguous(), seed.to(torch.int64).contiguous(), offset.to(torch.int64).contiguous(),
            out, vocab, salt, HAS_ALLOWED=allowed is not None, BLOCK=block, num_warps=8 if block >= 4096 else 4)
    return out

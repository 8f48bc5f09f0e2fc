"""Causal prefill attention over the paged KV cache in one Triton kernel that needs no host planning (the
`triton` attention backend's prefill, see rt/attention/triton_backend.py).

A launch holds S sequences (rows of the page table) whose new tokens are consecutive in q: sequence s owns
tokens qo_indptr[s] .. qo_indptr[s + 1] (a padded sequence owns none) and has kv_lens[s] tokens of KV after
this launch's were written, so its token i sits at position kv_lens[s] - qo_len + i and sees positions up to
its own.

Grid (S, ceil(T / BLOCK_M), Hkv), fixed by the launch's shapes (so a CUDA graph captured for a token bucket
replays for any split of its tokens into sequences). Program (s, m, h) takes tokens m * BLOCK_M .. of sequence
s (it ends at once where the sequence has fewer) and attends their G query heads of KV head h: the tile's
BLOCK_M x G_PAD (token, head) pairs are the rows of one tensor-core product against each block of BLOCK_N KV
tokens, with an online softmax in float32 and the causal mask per row. The KV blocks read stop at the tile's
last position. K and V are converted to q's dtype as they load, so the cache may be stored narrower (float8).

`prefill_attention(q [T, Hq, D], cache [P, 2, page, Hkv, D], page_table [S, C] int32, kv_lens [S] int32,
qo_indptr [S + 1] int32, scale)` -> [T, Hq, D] in q's dtype; rows of q past qo_indptr[S] are zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton: the backend is unavailable
    triton = None

TILE_ROWS = 64  # (token, head) rows of a program's tile: BLOCK_M = TILE_ROWS // G_PAD tokens


@dataclass(frozen=True)
class PrefillConfig:
    """KV tokens per block, warps, pipeline stages."""

    block_n: int = 32
    warps: int = 4
    stages: int = 2


DEFAULT_CONFIG = PrefillConfig()


def tile_tokens(group: int) -> int:
    """Tokens per program for a GQA group: the tile's rows are TILE_ROWS (token, head) pairs, heads padded to a
    power of two."""
    return max(1, TILE_ROWS // (1 << max(group - 1, 0).bit_length()))


def prefill_attention(q: Tensor, cache: Tensor, page_table: Tensor, kv_lens: Tensor, qo_indptr: Tensor,
                      scale: float, config: PrefillConfig = DEFAULT_CONFIG) -> Tensor:
    """See the module docstring."""
    tokens, num_q_heads, head_dim = q.shape
    _, two, page_size, num_kv_heads, cache_dim = cache.shape
    seqs = page_table.shape[0]
    group = num_q_heads // num_kv_heads
    if two != 2 or cache_dim != head_dim or group * num_kv_heads != num_q_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit the cache {tuple(cache.shape)}")
    if kv_lens.shape[0] < seqs or qo_indptr.shape[0] < seqs + 1:
        raise ValueError(f"{seqs} sequences need {seqs} kv lengths and {seqs + 1} offsets")
    if config.block_n % page_size and page_size % config.block_n:
        raise ValueError(f"block_n {config.block_n} and page size {page_size}: one must divide the other")
    if not cache.is_contiguous():
        raise ValueError("the KV cache must be contiguous")
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.zeros_like(q)
    block_m = tile_tokens(group)
    if tokens and seqs:
        gp = TILE_ROWS // block_m
        _prefill_kernel[(seqs, triton.cdiv(tokens, block_m), num_kv_heads)](
            q, cache, page_table, kv_lens, qo_indptr, out, scale, q.stride(0), q.stride(1), page_table.stride(0),
            out.stride(0), out.stride(1), HKV=num_kv_heads, G=group, G_PAD=gp, D=head_dim, PAGE=page_size,
            BLOCK_M=block_m, BLOCK_N=config.block_n, num_warps=config.warps, num_stages=config.stages)
    return out


if triton is not None:

    @triton.jit
    def _prefill_kernel(q_ptr, cache_ptr, pt_ptr, kv_lens_ptr, qo_ptr, out_ptr, scale, stride_qt, stride_qh,
                        stride_pt, stride_ot, stride_oh, HKV: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
                        D: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        s = tl.program_id(0)
        m = tl.program_id(1)
        h = tl.program_id(2)
        begin = tl.load(qo_ptr + s)
        end = tl.load(qo_ptr + s + 1)
        t0 = begin + m * BLOCK_M
        if t0 < end:
            kv_len = tl.load(kv_lens_ptr + s)
            first = kv_len - (end - begin)  # the position of the sequence's first new token
            rr = tl.arange(0, BLOCK_M * G_PAD)
            tok = t0 + rr // G_PAD
            g = rr % G_PAD
            real = (tok < end) & (g < G)
            pos = first + (tok - begin)  # each row's position: it sees KV positions <= pos
            rd = tl.arange(0, D)
            rn = tl.arange(0, BLOCK_N)
            row_q = tok.to(tl.int64) * stride_qt + (h * G + g) * stride_qh
            q = tl.load(q_ptr + row_q[:, None] + rd[None, :], mask=real[:, None], other=0.0)
            m_i = tl.full([BLOCK_M * G_PAD], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M * G_PAD], tl.float32)
            acc = tl.zeros([BLOCK_M * G_PAD, D], tl.float32)
            qk_scale = scale * 1.4426950408889634  # exp2 of scores in log2 units
            stop = tl.minimum(kv_len, first + (t0 + BLOCK_M - begin))  # past the tile's last position
            for n0 in range(0, stop, BLOCK_N):
                t = n0 + rn
                live = t < stop
                page = tl.load(pt_ptr + s * stride_pt + t // PAGE, mask=live, other=0).to(tl.int64)
                at = page * (2 * PAGE * HKV * D) + ((t % PAGE) * HKV + h) * D
                k = tl.load(cache_ptr + at[:, None] + rd[None, :], mask=live[:, None], other=0.0).to(q.dtype)
                v = tl.load(cache_ptr + PAGE * HKV * D + at[:, None] + rd[None, :], mask=live[:, None],
                            other=0.0).to(q.dtype)
                seen = live[None, :] & (t[None, :] <= pos[:, None])
                scores = tl.where(seen, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(scores, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees nothing yet
                p = tl.exp2(scores - m_safe[:, None])
                alpha = tl.exp2(m_i - m_safe)
                l_i = l_i * alpha + tl.sum(p, axis=1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
            o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
            row_o = tok.to(tl.int64) * stride_ot + (h * G + g) * stride_oh
            tl.store(out_ptr + row_o[:, None] + rd[None, :], o.to(out_ptr.dtype.element_ty), mask=real[:, None])

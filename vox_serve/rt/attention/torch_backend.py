"""The reference paged-attention backend in plain PyTorch (CPU and CUDA)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vox_serve.rt.attention.base import AttentionBackend, AttentionBuffers, AttentionPlan, PlanInputs
from vox_serve.rt.attention.kv_write import QKPrep


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Masked softmax attention in float32 with grouped KV heads.

    q: [B, M, Hq, D]; k, v: [B, L, Hkv, D]; mask: [B, M, L] bool (True = visible).
    Returns [B, M, Hq, D] float32.
    """
    b, m, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.float().reshape(b, m, hkv, hq // hkv, d)
    scores = torch.einsum("bmhgd,blhd->bhgml", qg, k.float()) * scale
    # A finite floor instead of -inf: a row with nothing visible (never produced by a valid plan)
    # then averages finite values instead of turning into NaN.
    scores = scores.masked_fill(~mask[:, None, None], torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgml,blhd->bmhgd", probs, v.float())
    return out.reshape(b, m, hq, d)


def _decode_pages_bucket(kv_lens: Any, page_size: int, max_pages_per_seq: int) -> int:
    """Page columns to gather in a decode step: the longest sequence's pages, rounded up to a
    power of two so eager steps reuse a handful of shapes, capped at the page-table width."""
    longest = int(kv_lens.max()) if len(kv_lens) else 1  # kv lengths are >= 1; an empty plan gathers one page
    pages = max(1, -(-longest // page_size))
    return min(1 << (pages - 1).bit_length(), max_pages_per_seq)


class TorchAttentionBackend(AttentionBackend):
    """Reference backend in plain PyTorch; runs on CPU and CUDA.

    Decode is written for CUDA-graph capture: static shapes, no host syncs. Every row gathers a
    fixed number of page-table columns and masks positions >= kv_len, so unused page-table columns
    must hold a valid page id (0, the null page, is fine). Padded rows (kv_len 1, page table of
    zeros, slot 0) read and write only the null page and stay finite.

    Decode bucket: in eager mode `plan()` limits the gathered columns to the longest planned
    sequence rounded up to a power of two pages (`decode_num_pages`). While a CUDA graph is being
    captured the bucket is ignored and all `max_pages_per_seq` columns are gathered, so a graph
    captured once per batch size stays correct for every later kv_len.

    Prefill and mixed steps loop over sequences in Python with the host ints from `plan()`; they
    are eager only.
    """

    name = "torch"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plan: AttentionPlan | None = None
        self.decode_num_pages: int | None = None
        # Per sequence of a prefill/mixed step: (token start, token end, page count, mask [qo, kv]).
        self._prefill_seqs: list[tuple[int, int, int, Tensor]] = []

    def plan(self, plan: AttentionPlan, inputs: PlanInputs) -> None:
        max_pages_per_seq = inputs.max_pages_per_seq
        self._plan = plan
        self._prefill_seqs = []
        if plan.is_decode:
            self.decode_num_pages = _decode_pages_bucket(plan.kv_lens, self.page_size, max_pages_per_seq)
            return
        self.decode_num_pages = None
        start = 0
        for qo_len, kv_len in zip(plan.qo_lens.tolist(), plan.kv_lens.tolist(), strict=True):
            num_pages = -(-kv_len // self.page_size)
            if num_pages > max_pages_per_seq:
                raise ValueError(f"kv_len {kv_len} needs {num_pages} pages > {max_pages_per_seq}")
            # Query i sits at absolute position kv_len - qo_len + i and sees everything up to it.
            query_pos = torch.arange(kv_len - qo_len, kv_len, device=self.device)
            mask = torch.arange(kv_len, device=self.device)[None, :] <= query_pos[:, None]
            self._prefill_seqs.append((start, start + qo_len, num_pages, mask))
            start += qo_len

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, bufs: AttentionBuffers,
                prep: QKPrep | None = None) -> Tensor:
        if self._plan is None:
            raise RuntimeError("TorchAttentionBackend.forward called before plan()")
        cache = self.kv_caches[layer]
        q = self._write_kv(cache, q, k, v, bufs.slot_mapping[: q.shape[0]], prep)
        if self._plan.is_decode:
            return self._decode(cache, q, bufs)
        return self._prefill(cache, q, bufs)

    def _decode(self, cache: Tensor, q: Tensor, bufs: AttentionBuffers) -> Tensor:
        """One query per row; q: [T, Hq, D] -> [T, Hq, D]."""
        num_rows = q.shape[0]
        num_cols = bufs.page_table.shape[1]
        capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
        if self.decode_num_pages is not None and not capturing:
            num_cols = self.decode_num_pages
        pages = bufs.page_table[:num_rows, :num_cols].long()  # [T, C]
        kv_len = num_cols * self.page_size
        # [T, C, page_size, Hkv, D] -> [T, C * page_size, Hkv, D]
        k = cache[pages, 0].reshape(num_rows, kv_len, self.num_kv_heads, self.head_dim)
        v = cache[pages, 1].reshape(num_rows, kv_len, self.num_kv_heads, self.head_dim)
        positions = torch.arange(kv_len, device=q.device)
        mask = positions[None, :] < bufs.kv_lens[:num_rows, None]  # [T, L]
        out = _attend(q[:, None], k, v, mask[:, None], self.scale)
        return out[:, 0].to(q.dtype)

    def _prefill(self, cache: Tensor, q: Tensor, bufs: AttentionBuffers) -> Tensor:
        """Ragged sequences, one at a time; q: [T, Hq, D] -> [T, Hq, D], padded rows zero."""
        out = torch.zeros_like(q)
        for seq, (start, end, num_pages, mask) in enumerate(self._prefill_seqs):
            kv_len = mask.shape[1]
            pages = bufs.page_table[seq, :num_pages].long()
            k = cache[pages, 0].reshape(-1, self.num_kv_heads, self.head_dim)[:kv_len]
            v = cache[pages, 1].reshape(-1, self.num_kv_heads, self.head_dim)[:kv_len]
            attended = _attend(q[None, start:end], k[None], v[None], mask[None], self.scale)
            out[start:end] = attended[0].to(q.dtype)
        return out



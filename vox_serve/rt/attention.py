"""Paged attention: the backend interface the models call, and the PyTorch backend.

Every backend shares one KV-cache layout, FlashInfer's NHD paged layout, so the worker, the page
pool and any backend agree on where token `t` of a sequence lives:
`kv_caches[layer][page_table[seq, t // page_size], 0 or 1, t % page_size]` (0 = K, 1 = V).

A step has two halves. `plan()` runs on the host before the step (outside any CUDA graph) with
plain ints; `forward()` runs once per layer inside the step and may only touch device tensors
whose shapes are fixed for the captured batch size.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor


@dataclass
class AttentionPlan:
    """Host-side facts of one step, built by the worker from request state."""

    num_seqs: int
    qo_lens: list[int]  # new (query) tokens per sequence in this step
    kv_lens: list[int]  # KV length per sequence AFTER this step's tokens are written
    pages: list[list[int]] | None = None  # page ids per sequence (host planners need them)
    num_rows: int | None = None  # sequences of the launch (the bucket); padded ones use the null page
    graph_tokens: int | None = None  # prefill replayed as a CUDA graph over this many token rows

    def __post_init__(self) -> None:
        if len(self.qo_lens) != self.num_seqs or len(self.kv_lens) != self.num_seqs:
            raise ValueError(
                f"num_seqs={self.num_seqs} but {len(self.qo_lens)} qo_lens, {len(self.kv_lens)} kv_lens"
            )
        for qo_len, kv_len in zip(self.qo_lens, self.kv_lens, strict=True):
            if not 1 <= qo_len <= kv_len:
                raise ValueError(f"need 1 <= qo_len <= kv_len, got qo_len={qo_len}, kv_len={kv_len}")

    @property
    def is_decode(self) -> bool:
        return all(qo_len == 1 for qo_len in self.qo_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.qo_lens)


@dataclass
class AttentionBuffers:
    """Static tensors (views of the step's input arena) at their maximum shapes.

    The device views are what stages read. Host planners (FlashInfer) also get the paged KV in CSR
    form: `kv_indices` on the device and the offsets on the host (pinned views of the same arena,
    written by the worker before the step's one upload), so planning never copies from pageable
    memory or waits for the device.
    """

    page_table: Tensor  # [max_batch, max_pages_per_seq] int32: page ids of each sequence in order
    kv_lens: Tensor  # [max_batch] int32
    qo_indptr: Tensor  # [max_batch + 1] int32: token offsets of each sequence in the flattened batch
    slot_mapping: Tensor  # [max_tokens] int64: page * page_size + offset of each new token's K/V
    kv_indices: Tensor | None = None  # [max_batch * max_pages_per_seq] int32: used pages of every row in order
    kv_indptr_host: Tensor | None = None  # [max_batch + 1] int32 (host): row i's pages are kv_indices[a:b]
    kv_last_page_len_host: Tensor | None = None  # [max_batch] int32 (host): entries used in each row's last page
    qo_indptr_host: Tensor | None = None  # [max_batch + 1] int32 (host)


def paged_kv_csr(page_table: np.ndarray, kv_lens: np.ndarray, page_size: int, indptr: np.ndarray,
                 indices: np.ndarray, last: np.ndarray) -> int:
    """Fill indptr [R + 1], indices [>= R * P] and last [R] from page_table [R, P] and kv_lens [R].

    Row i uses its first ceil(kv_lens[i] / page_size) pages. Returns the number of indices. Rows
    padded to a bucket (kv_len 1, page table of zeros) use one entry of the null page.
    """
    rows, width = page_table.shape
    used = (kv_lens.astype(np.int64) + page_size - 1) // page_size
    indptr[0] = 0
    np.cumsum(used, out=indptr[1 : rows + 1])
    flat = page_table[np.arange(width)[None, :] < used[:, None]]  # row-major: each row's pages in order
    indices[: flat.size] = flat
    last[:rows] = kv_lens - (used - 1) * page_size
    return int(flat.size)


class AttentionBackend(ABC):
    """Owns the paged KV caches of all layers and computes attention over them."""

    name: str = "abstract"
    prefill_graphs: bool = False  # whether prefill may be captured (needs graph-static planning)

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_q_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.scale = 1.0 / math.sqrt(head_dim)
        # Zeroed, not empty: masked-out cache entries still get multiplied by a zero probability,
        # and 0 * NaN from uninitialised memory would poison the output.
        shape = (num_pages, 2, page_size, num_kv_heads, head_dim)
        self.kv_caches: list[Tensor] = [
            torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)
        ]

    @abstractmethod
    def plan(self, plan: AttentionPlan, bufs: AttentionBuffers) -> None:
        """Host-side preparation for the next step; called before the step, never inside a graph."""

    @abstractmethod
    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, bufs: AttentionBuffers) -> Tensor:
        """Write k/v into the cache at `bufs.slot_mapping[:T]`, then attend causally.

        q: [T, Hq, D]; k, v: [T, Hkv, D], T = rows of this launch (may exceed the planned token
        count: padded rows). Token i of a sequence sees its KV positions 0 .. kv_len - qo_len + i.
        Returns [T, Hq, D] in q's dtype.
        """

    def memory_bytes(self) -> int:
        return sum(cache.numel() * cache.element_size() for cache in self.kv_caches)

    def _write_kv(self, cache: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
        """cache: [P, 2, page_size, Hkv, D]; k, v: [T, Hkv, D]; slots: [T] int64."""
        page = slots // self.page_size
        offset = slots % self.page_size
        cache[page, 0, offset] = k.to(cache.dtype)
        cache[page, 1, offset] = v.to(cache.dtype)


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


def _decode_pages_bucket(kv_lens: list[int], page_size: int, max_pages_per_seq: int) -> int:
    """Page columns to gather in a decode step: the longest sequence's pages, rounded up to a
    power of two so eager steps reuse a handful of shapes, capped at the page-table width."""
    longest = max(kv_lens, default=1)
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

    def plan(self, plan: AttentionPlan, bufs: AttentionBuffers) -> None:
        max_pages_per_seq = bufs.page_table.shape[1]
        self._plan = plan
        self._prefill_seqs = []
        if plan.is_decode:
            self.decode_num_pages = _decode_pages_bucket(plan.kv_lens, self.page_size, max_pages_per_seq)
            return
        self.decode_num_pages = None
        start = 0
        for qo_len, kv_len in zip(plan.qo_lens, plan.kv_lens, strict=True):
            num_pages = -(-kv_len // self.page_size)
            if num_pages > max_pages_per_seq:
                raise ValueError(f"kv_len {kv_len} needs {num_pages} pages > {max_pages_per_seq}")
            # Query i sits at absolute position kv_len - qo_len + i and sees everything up to it.
            query_pos = torch.arange(kv_len - qo_len, kv_len, device=self.device)
            mask = torch.arange(kv_len, device=self.device)[None, :] <= query_pos[:, None]
            self._prefill_seqs.append((start, start + qo_len, num_pages, mask))
            start += qo_len

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, bufs: AttentionBuffers) -> Tensor:
        if self._plan is None:
            raise RuntimeError("TorchAttentionBackend.forward called before plan()")
        cache = self.kv_caches[layer]
        self._write_kv(cache, k, v, bufs.slot_mapping[: q.shape[0]])
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


def flashinfer_available() -> bool:
    """True when flashinfer imports (an installed but broken build counts as unavailable)."""
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


def flashinfer_unsupported(**kwargs: Any) -> str | None:
    """Why FlashInfer cannot serve this configuration (None when it can)."""
    if torch.device(kwargs.get("device", "cpu")).type != "cuda":
        return "it needs a CUDA device"
    if kwargs.get("dtype") not in (torch.float16, torch.bfloat16):
        return f"it needs float16 or bfloat16, not {kwargs.get('dtype')}"
    if kwargs.get("head_dim") not in (64, 128, 256):
        return f"head_dim {kwargs.get('head_dim')} is not one of 64, 128, 256"
    if not flashinfer_available():
        return "the flashinfer-python package is not installed (or does not import)"
    return None


def make_attention_backend(name: str, **kwargs: Any) -> AttentionBackend:
    """Build the attention backend called `name` ("torch", "flashinfer" or "auto")."""
    if name == "auto":
        name = "flashinfer" if flashinfer_unsupported(**kwargs) is None else "torch"
    if name == "torch":
        return TorchAttentionBackend(**kwargs)
    if name == "flashinfer":
        why = flashinfer_unsupported(**kwargs)
        if why is not None:
            raise RuntimeError(f"flashinfer backend not available: {why}")
        from vox_serve.rt.attention_flashinfer import FlashInferAttentionBackend

        return FlashInferAttentionBackend(**kwargs)
    raise ValueError(f"unknown attention backend {name!r}; expected 'torch', 'flashinfer' or 'auto'")

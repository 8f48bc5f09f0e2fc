"""Paged attention: the backend interface the models call.

Every backend shares one KV-cache layout, FlashInfer's NHD paged layout, so the worker, the page
pool and any backend agree on where token `t` of a sequence lives:
`kv_caches[layer][page_table[seq, t // page_size], 0 or 1, t % page_size]` (0 = K, 1 = V).

A step has two halves. `plan()` runs on the host before the step (outside any CUDA graph) with
the launch's row sizes; `forward()` runs once per layer inside the step and may only touch device
tensors whose shapes are fixed for the captured batch size. The page rows a launch reads are
gathered from the slots' page tables inside the stage (`rt/lm_batch.py`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vox_serve.core.plan import ones
from vox_serve.rt.attention.kv_write import QKPrep, write_kv


@dataclass
class AttentionPlan:
    """Host-side facts of one launch: the sizes of its rows."""

    num_seqs: int
    qo_lens: np.ndarray  # [num_seqs] new (query) tokens per sequence in this launch
    kv_lens: np.ndarray  # [num_seqs] KV length per sequence AFTER this launch's tokens are written
    num_rows: int | None = None  # sequences of the launch (the bucket); padded ones use the null page
    graph_tokens: int | None = None  # prefill replayed as a CUDA graph over this many token rows
    decode: bool = False  # a decode launch (one query per row), planned with the decode planner

    def __post_init__(self) -> None:
        self.qo_lens = np.asarray(self.qo_lens, dtype=np.int64)
        self.kv_lens = np.asarray(self.kv_lens, dtype=np.int64)
        if len(self.qo_lens) != self.num_seqs or len(self.kv_lens) != self.num_seqs:
            raise ValueError(f"num_seqs={self.num_seqs} but {len(self.qo_lens)} qo_lens, {len(self.kv_lens)} kv_lens")
        bad = (self.qo_lens < 1) | (self.qo_lens > self.kv_lens)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"need 1 <= qo_len <= kv_len, got qo_len={self.qo_lens[i]}, kv_len={self.kv_lens[i]}")

    @classmethod
    def decode_rows(cls, kv_lens: np.ndarray) -> AttentionPlan:
        """A decode launch of len(kv_lens) rows (padded ones included), one query each: checked by the one rule
        it can break (kv_len >= 1) instead of every row's pair."""
        kv_lens = np.asarray(kv_lens, dtype=np.int64)
        n = len(kv_lens)
        if n and int(kv_lens.min()) < 1:
            raise ValueError(f"need kv_len >= 1 in a decode launch, got {int(kv_lens.min())}")
        plan = cls.__new__(cls)  # every field set here, without __post_init__'s per-row checks
        vars(plan).update(num_seqs=n, qo_lens=ones(n, np.int64), kv_lens=kv_lens, num_rows=n, graph_tokens=None,
                          decode=True)
        return plan

    @property
    def is_decode(self) -> bool:
        return self.decode

    @property
    def num_tokens(self) -> int:
        return int(self.qo_lens.sum())


@dataclass
class AttentionBuffers:
    """Device tensors of one launch (derived in the stage) and the host CSR offsets planners read.

    The device views are what stages read. Host planners (FlashInfer) also get the paged KV in CSR
    form: `kv_indices` on the device (filled inside the stage from the page rows) and the offsets on
    the host (pinned views of the step's input arena, written by the worker before the step's one
    upload), so planning never copies from pageable memory or waits for the device.
    """

    page_table: Tensor  # [rows, max_pages_per_seq] int32: page ids of each sequence in order
    kv_lens: Tensor  # [rows] int32
    qo_indptr: Tensor  # [max_batch + 1] int32: token offsets of each sequence in the flattened batch
    slot_mapping: Tensor  # [max_tokens] int64: page * page_size + offset of each new token's K/V
    kv_indices: Tensor | None = None  # [max_batch * max_pages_per_seq] int32: used pages of every row in order
    kv_indptr_host: Tensor | None = None  # [max_batch + 1] int32 (host): row i's pages are kv_indices[a:b]
    kv_last_page_len_host: Tensor | None = None  # [max_batch] int32 (host): entries used in each row's last page
    qo_indptr_host: Tensor | None = None  # [max_batch + 1] int32 (host)


@dataclass
class PlanInputs:
    """What `plan()` reads before a launch: host views of the CSR offsets the worker wrote (pinned, in the
    step's input arena) and the stage's device buffer of page indices (filled inside the stage)."""

    kv_indptr: Tensor  # [rows + 1] int32 (host)
    kv_last_page_len: Tensor  # [rows] int32 (host)
    qo_indptr: Tensor | None  # [rows + 1] int32 (host; prefill)
    kv_indices: Tensor | None  # [rows * max_pages_per_seq] int32 (device)
    max_pages_per_seq: int


def paged_kv_offsets(kv_lens: np.ndarray, page_size: int, indptr: np.ndarray, last: np.ndarray) -> int:
    """Fill indptr [R + 1] and last [R] (entries used in each row's last page) for rows of kv_lens [R];
    row i uses its first ceil(kv_lens[i] / page_size) pages. Returns the number of page indices."""
    rows = len(kv_lens)
    used = (np.asarray(kv_lens, dtype=np.int64) + page_size - 1) // page_size
    indptr[0] = 0
    indptr[1 : rows + 1] = used.cumsum()  # (np.cumsum into an int32 `out` takes a slow casting path)
    last[:rows] = kv_lens - (used - 1) * page_size
    return int(indptr[rows])


class AttentionBackend(ABC):
    """Owns the paged KV caches of all layers and computes attention over them."""

    name: str = "abstract"
    prefill_graphs: bool = False  # whether prefill may be captured (needs graph-static planning)
    needs_kv_indices: bool = False  # whether stages must fill the CSR page indices (host planners)

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
        kv_dtype: torch.dtype | None = None,
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
        self.kv_dtype = dtype if kv_dtype is None else kv_dtype  # the cache's (kv_write: float8 or the model's)
        self.device = torch.device(device)
        self.scale = 1.0 / math.sqrt(head_dim)
        # Zeroed, not empty: masked-out cache entries still get multiplied by a zero probability,
        # and 0 * NaN from uninitialised memory would poison the output.
        shape = (num_pages, 2, page_size, num_kv_heads, head_dim)
        self.kv_caches: list[Tensor] = [
            torch.zeros(shape, dtype=self.kv_dtype, device=self.device) for _ in range(num_layers)
        ]

    @abstractmethod
    def plan(self, plan: AttentionPlan, inputs: PlanInputs) -> None:
        """Host-side preparation for the next step; called before the step, never inside a graph."""

    @abstractmethod
    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, bufs: AttentionBuffers,
                prep: QKPrep | None = None) -> Tensor:
        """Prepare q and k by `prep` (none: they come rotated), write k/v into the cache at
        `bufs.slot_mapping[:T]`, then attend causally (`_write_kv` does the first two).

        q: [T, Hq, D]; k, v: [T, Hkv, D], T = rows of this launch (may exceed the planned token
        count: padded rows). Token i of a sequence sees its KV positions 0 .. kv_len - qo_len + i.
        Returns [T, Hq, D] in q's dtype.
        """

    def memory_bytes(self) -> int:
        return sum(cache.numel() * cache.element_size() for cache in self.kv_caches)

    def _write_kv(self, cache: Tensor, q: Tensor, k: Tensor, v: Tensor, slots: Tensor, prep: QKPrep | None) -> Tensor:
        """cache: [P, 2, page_size, Hkv, D]; q: [T, Hq, D]; k, v: [T, Hkv, D]; slots: [T] int64 -> q, prepared.
        (One fused kernel on GPUs: `kv_write.write_kv`.)"""
        return write_kv(cache[:, 0], cache[:, 1], q, k, v, slots, prep)

"""FlashInfer paged attention (CUDA only), planned on the host each step.

Decode uses one `BatchDecodeWithPagedKVCacheWrapper` per batch bucket, built with
`use_cuda_graph=True` so the decode graph captured for that bucket replays against whatever the
latest `plan()` wrote into the wrapper's buffers. Prefill (ragged, causal) runs eagerly through
one `BatchPrefillWithPagedKVCacheWrapper`. Padded decode rows attend to one entry of the null
page. The KV layout is the shared NHD layout, so the PyTorch backend is the reference.
"""

from __future__ import annotations

from typing import Any

import flashinfer
import torch
from torch import Tensor

from vox_serve.rt.attention import AttentionBackend, AttentionBuffers, AttentionPlan

WORKSPACE_BYTES = 128 << 20
NULL_PAGE = 0


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"
    prefill_graphs = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._decode: dict[int, Any] = {}
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        # Captured prefill: per token bucket a graph-mode wrapper (fixed sequence count) and a static
        # output whose rows past the step's tokens keep finite stale values (padded rows, never read).
        self._prefill_graphs: dict[int, tuple[Any, Tensor]] = {}
        self._active_prefill: tuple[Any, Tensor | None] = (self._prefill, None)
        self._plan: AttentionPlan | None = None
        self._active_decode: Any = None
        self._decoding = False

    def _decode_wrapper(self, rows: int, max_pages_per_seq: int) -> Any:
        """The decode wrapper of a bucket, with static buffers sized for any page count."""
        if rows not in self._decode:
            dev = self.device
            self._decode[rows] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True,
                use_tensor_cores=self.num_q_heads // self.num_kv_heads >= 4,
                paged_kv_indptr_buffer=torch.zeros(rows + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buffer=torch.zeros(rows * max_pages_per_seq, dtype=torch.int32, device=dev),
                paged_kv_last_page_len_buffer=torch.zeros(rows, dtype=torch.int32, device=dev),
            )
        return self._decode[rows]

    def plan(self, plan: AttentionPlan, bufs: AttentionBuffers) -> None:
        """Plan from the CSR views the worker wrote: offsets from pinned host memory (copied
        asynchronously), page indices already on the device, so nothing here waits for the GPU."""
        if bufs.kv_indices is None or bufs.kv_indptr_host is None or bufs.kv_last_page_len_host is None:
            raise ValueError("the flashinfer backend needs the paged-KV CSR buffers (see paged_kv_csr)")
        self._plan = plan
        common = dict(num_kv_heads=self.num_kv_heads, page_size=self.page_size, q_data_type=self.dtype,
                      kv_data_type=self.dtype, sm_scale=self.scale)
        rows = plan.num_rows or plan.num_seqs
        indptr = bufs.kv_indptr_host[: rows + 1]
        indices = bufs.kv_indices[: int(indptr[rows])]
        last = bufs.kv_last_page_len_host[:rows]
        # A captured prefill stays on its prefill wrapper even when every query is one token long.
        self._decoding = plan.is_decode and plan.graph_tokens is None
        if self._decoding:
            self._active_decode = self._decode_wrapper(rows, bufs.page_table.shape[1])
            self._active_decode.plan(indptr, indices, last, num_qo_heads=self.num_q_heads,
                                     head_dim=self.head_dim, non_blocking=True, **common)
            return
        qo = bufs.qo_indptr_host[: rows + 1]
        self._active_prefill = self._prefill_wrapper(plan, rows, bufs.page_table.shape[1])
        self._active_prefill[0].plan(qo, indptr, indices, last, num_qo_heads=self.num_q_heads,
                                     head_dim_qk=self.head_dim, causal=True, non_blocking=True, **common)

    def _prefill_wrapper(self, plan: AttentionPlan, rows: int, max_pages_per_seq: int) -> tuple[Any, Tensor | None]:
        """(wrapper, static output) for this prefill: eager, or the graph-mode pair of its token bucket."""
        tokens = plan.graph_tokens
        if tokens is None:
            return self._prefill, None
        if tokens not in self._prefill_graphs:
            dev = self.device
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True,
                qo_indptr_buf=torch.zeros(rows + 1, dtype=torch.int32, device=dev),
                paged_kv_indptr_buf=torch.zeros(rows + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buf=torch.zeros(rows * max_pages_per_seq, dtype=torch.int32, device=dev),
                paged_kv_last_page_len_buf=torch.zeros(rows, dtype=torch.int32, device=dev),
            )
            out = torch.zeros(tokens, self.num_q_heads, self.head_dim, dtype=self.dtype, device=dev)
            self._prefill_graphs[tokens] = (wrapper, out)
        return self._prefill_graphs[tokens]

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, bufs: AttentionBuffers) -> Tensor:
        if self._plan is None:
            raise RuntimeError("FlashInferAttentionBackend.forward called before plan()")
        cache = self.kv_caches[layer]
        self._write_kv(cache, k, v, bufs.slot_mapping[: q.shape[0]])
        if self._decoding:
            return self._active_decode.run(q, cache)
        wrapper, out = self._active_prefill
        if out is not None:  # captured: every row of the bucket goes in, the planned ones are written
            return wrapper.run(q, cache, out=out)
        n = self._plan.num_tokens
        out = torch.zeros_like(q)
        out[:n] = wrapper.run(q[:n], cache)
        return out

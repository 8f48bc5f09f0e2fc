"""Paged attention in Triton kernels that need no host planning (CUDA only): `--attention-backend triton`, and
what `auto` picks for a float8 KV cache (`--kv-cache-dtype fp8`), which FlashInfer's modules shipped here do
not read.

Decode runs rt/attention/triton_decode's split-KV kernel at every batch bucket (one workspace of partials per
bucket), prefill rt/attention/triton_prefill's causal kernel. Both read only device tensors the stage already
has (page tables, KV lengths, token offsets), so `plan()` keeps nothing but the launch's kind, every launch can
be captured (prefill too), and a runtime planning by itself has no planner to run (the engine spec publishes
none).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vox_serve.rt.attention import triton_decode, triton_prefill
from vox_serve.rt.attention.base import AttentionBackend, AttentionBuffers, AttentionPlan, PlanInputs
from vox_serve.rt.attention.kv_write import QKPrep


def triton_unsupported(*, device: Any = "cpu", head_dim: int = 0, page_size: int = 16, **_: Any) -> str | None:
    """Why this backend cannot serve a configuration (None when it can)."""
    if torch.device(device).type != "cuda":
        return "it needs a CUDA device"
    if triton_decode.triton is None:
        return "Triton is not installed (or does not import)"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return f"head_dim {head_dim} is not a power of two >= 16"
    if not triton_decode.blocks_fit(page_size):
        blocks = ", ".join(map(str, triton_decode.BLOCKS))
        return f"page size {page_size} neither divides nor is divided by each decode block ({blocks} tokens)"
    return None


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    prefill_graphs = True  # planless: a captured prefill replays for any split of its tokens into sequences

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plan: AttentionPlan | None = None
        self._workspaces = triton_decode.BucketWorkspaces(self.num_kv_heads, self.num_q_heads // self.num_kv_heads,
                                                          self.head_dim)

    def plan(self, plan: AttentionPlan, inputs: PlanInputs) -> None:
        self._plan = plan

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, bufs: AttentionBuffers,
                prep: QKPrep | None = None) -> Tensor:
        if self._plan is None:
            raise RuntimeError("TritonAttentionBackend.forward called before plan()")
        cache = self.kv_caches[layer]
        q = self._write_kv(cache, q, k, v, bufs.slot_mapping[: q.shape[0]], prep)
        q = q if q.stride(-1) == 1 else q.contiguous()
        if self._plan.is_decode:
            rows = q.shape[0]
            return triton_decode.decode_attention(q, cache, bufs.page_table[:rows], bufs.kv_lens[:rows], self.scale,
                                                  self._workspaces.of(q))
        return triton_prefill.prefill_attention(q, cache, bufs.page_table, bufs.kv_lens, bufs.qo_indptr, self.scale)

"""FlashInfer paged attention (CUDA only), planned on the host before each launch.

Decode uses one `BatchDecodeWithPagedKVCacheWrapper` per batch bucket, built with
`use_cuda_graph=True` so the decode graph captured for that bucket replays against whatever the
latest `plan()` wrote into the wrapper's buffers. Prefill runs through a graph-mode
`BatchPrefillWithPagedKVCacheWrapper` per token bucket (a fixed sequence count, padded sequences
empty) when captured, else through an eager one. Every wrapper reads its page indices from the
stage's CSR index buffer (`Program.kv_indices`), which the stage itself fills from the slots' page
tables; `plan()` only reads the host offsets, so it never waits for the device.

Decode buckets of 1-2 rows whose decode would run FlashInfer's CUDA-core kernels (GQA groups below
TENSOR_CORE_GROUP: Qwen3-TTS's talker) run `rt/attention/triton_decode`'s planless kernel instead (on an H200
the Qwen3-TTS frame at 1 row 3.667 -> 3.615 ms, at 2 rows 4.144 -> 4.112; `VOX_TRITON_DECODE=0` keeps
FlashInfer's). Against the tensor-core decode it won alone but lost in Orpheus' step (2.098 -> 2.119 ms at 1 row,
2.459 -> 2.524 at 2), so that stays FlashInfer's there; buckets of 16-256 rows run the kernel at every geometry
(triton_decode.WIDE_ROWS, measured in the step; above 64 rows with 128-token blocks, triton_decode.config_for).
Which kernel a bucket runs is fixed by its geometry (`triton_decode.serves_geometry`), so the wrapper of a Triton
bucket is planned once, at its first launch (the capture), and not again: a runtime planning by itself still finds
one planner per captured bucket, with the plan info the graph was captured with, and this one spends no host time
per step on a plan no kernel reads.

A planner copies its pinned integer workspace to the device asynchronously; before a wrapper is
planned again its previous copy must have run, or the next plan would overwrite the pinned bytes
still being read (asynchronous scheduling plans step k+1 while step k runs). An event recorded
after each plan guards that.
"""

from __future__ import annotations

import os
from typing import Any

import flashinfer
import torch
from torch import Tensor

from vox_serve.rt.attention import triton_decode
from vox_serve.rt.attention.base import AttentionBackend, AttentionBuffers, AttentionPlan, PlanInputs
from vox_serve.rt.attention.kv_write import QKPrep

WORKSPACE_BYTES = 128 << 20
# Decode on tensor cores (FlashInfer's prefill kernels) from this GQA group size on; VOX_DECODE_TENSOR_CORES=0/1
# forces one kind. Measured on the H200 (benchmark/results/h200-2026-12-02c, decode graph ms, 512 tokens of KV):
# Orpheus (group 3) 1 row 2.90 -> 2.84, 64 rows 4.30 -> 4.11, 256 rows with 1024 tokens 12.21 -> 11.43;
# Qwen3-TTS's talker (group 2) slower on tensor cores at 16-256 rows (256: 13.31 -> 13.71). FlashInfer's fa3 decode
# (2-4x slower alone) and its XQA decode (slower in the step at 1-256 rows, likely as its grid follows the page
# table's width) were measured and not taken (benchmark/results/h200-2026-12-03e).
TENSOR_CORE_GROUP = 3


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"
    prefill_graphs = True
    needs_kv_indices = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._decode: dict[int, Any] = {}
        self._prefill_eager: Any = None
        # Captured prefill: per token bucket a graph-mode wrapper (fixed sequence count) and a static
        # output whose rows past the step's tokens keep finite stale values (padded rows, never read).
        self._prefill_graphs: dict[int, tuple[Any, Tensor]] = {}
        self._active_prefill: tuple[Any, Tensor | None] = (None, None)
        self._planned: dict[int, torch.cuda.Event] = {}  # id(wrapper) -> event after its last plan
        self._plan: AttentionPlan | None = None
        self._active_decode: Any = None
        self._forced_tensor_cores = os.environ.get("VOX_DECODE_TENSOR_CORES")
        group = self.num_q_heads // self.num_kv_heads
        self._triton_workspaces = triton_decode.BucketWorkspaces(self.num_kv_heads, group, self.head_dim)
        self._triton_buckets: dict[int, bool] = {}  # rows -> whether the bucket runs the Triton kernel (fixed)

    def planner_of(self, plan: AttentionPlan) -> str:
        """Which FlashInfer planner serves the launch (published in the engine spec)."""
        if plan.is_decode:
            return "decode_tensor_cores" if self._tensor_cores else "decode"
        return "prefill"

    @property
    def _tensor_cores(self) -> bool:
        """Whether decode runs FlashInfer's tensor-core kernels."""
        if self._forced_tensor_cores in ("0", "1"):
            return self._forced_tensor_cores == "1"
        return self.num_q_heads // self.num_kv_heads >= TENSOR_CORE_GROUP

    def _decode_wrapper(self, rows: int, inputs: PlanInputs) -> Any:
        """The decode wrapper of a bucket, with static buffers sized for any page count."""
        if rows not in self._decode:
            dev = self.device
            self._decode[rows] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self._tensor_cores,
                paged_kv_indptr_buffer=torch.zeros(rows + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buffer=inputs.kv_indices,
                paged_kv_last_page_len_buffer=torch.zeros(rows, dtype=torch.int32, device=dev),
            )
        return self._decode[rows]

    def _prefill_wrapper(self, plan: AttentionPlan, rows: int, inputs: PlanInputs) -> tuple[Any, Tensor | None]:
        """(wrapper, static output) for this prefill: eager, or the graph-mode pair of its token bucket."""
        tokens, dev = plan.graph_tokens, self.device
        if tokens is None:
            if self._prefill_eager is None:
                self._prefill_eager = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
            return self._prefill_eager, None
        if tokens not in self._prefill_graphs:
            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True,
                qo_indptr_buf=torch.zeros(rows + 1, dtype=torch.int32, device=dev),
                paged_kv_indptr_buf=torch.zeros(rows + 1, dtype=torch.int32, device=dev),
                paged_kv_indices_buf=inputs.kv_indices,
                paged_kv_last_page_len_buf=torch.zeros(rows, dtype=torch.int32, device=dev),
            )
            out = torch.zeros(tokens, self.num_q_heads, self.head_dim, dtype=self.dtype, device=dev)
            self._prefill_graphs[tokens] = (wrapper, out)
        return self._prefill_graphs[tokens]

    def plan(self, plan: AttentionPlan, inputs: PlanInputs) -> None:
        """Plan from the CSR offsets the worker wrote into pinned host memory (copied asynchronously)."""
        self._plan = plan
        common = dict(num_kv_heads=self.num_kv_heads, page_size=self.page_size, q_data_type=self.dtype,
                      kv_data_type=self.kv_dtype, sm_scale=self.scale)
        rows = plan.num_rows or plan.num_seqs
        indptr = inputs.kv_indptr[: rows + 1]
        last = inputs.kv_last_page_len[:rows]
        nnz = int(indptr[rows])
        if plan.is_decode:
            wrapper = self._active_decode = self._decode_wrapper(rows, inputs)
            if id(wrapper) in self._planned and self._triton_serves(rows):
                return  # the planless Triton kernel runs; the wrapper keeps its first plan (planner_layout)
            self._guarded(wrapper, lambda: wrapper.plan(
                indptr, inputs.kv_indices[:nnz], last, num_qo_heads=self.num_q_heads, head_dim=self.head_dim,
                non_blocking=True, **common))
            return
        self._active_prefill = self._prefill_wrapper(plan, rows, inputs)
        wrapper = self._active_prefill[0]
        self._guarded(wrapper, lambda: wrapper.plan(
            inputs.qo_indptr[: rows + 1], indptr, inputs.kv_indices[:nnz], last, num_qo_heads=self.num_q_heads,
            head_dim_qk=self.head_dim, causal=True, non_blocking=True, **common))

    def planner_layout(self) -> dict[str, Any]:
        """Per planned wrapper (decode per batch bucket, captured prefill per token bucket): the planner it
        was captured with and the addresses of its buffers, for a runtime that plans with FlashInfer's own
        functions and uploads the integer workspace itself (engine spec `attention.planners`)."""
        def buffers(wrapper: Any) -> dict[str, Any]:
            names = ("_float_workspace_buffer", "_int_workspace_buffer", "_pin_memory_int_workspace_buffer",
                     "_paged_kv_indptr_buf", "_paged_kv_last_page_len_buf", "_paged_kv_indices_buf", "_qo_indptr_buf",
                     "_kv_lens_buffer")
            out = {n.strip("_"): {"ptr": t.data_ptr(), "nbytes": t.numel() * t.element_size()}
                   for n in names if isinstance(t := getattr(wrapper, n, None), Tensor)}
            # In graph mode a wrapper's plan info (what its captured kernels were launched with) depends on
            # its fixed sizes only; a runtime planning by itself checks every plan against it.
            info = getattr(wrapper, "_plan_info", None)
            return {"backend": str(getattr(wrapper, "_backend", "")), **out,
                    "plan_info": [int(v) for v in info] if info is not None else None,
                    "rows": getattr(wrapper, "_fixed_batch_size", None),
                    "max_total_num_rows": getattr(wrapper, "_max_total_num_rows", None)}

        decode = "decode_tensor_cores" if self._tensor_cores else "decode"
        return {"decode": {str(rows): {"planner": decode, **buffers(w), "reads_plan": not self._triton_serves(rows)}
                           for rows, w in self._decode.items()},
                "prefill": {str(tokens): {"planner": "prefill", **buffers(w)}
                            for tokens, (w, _) in self._prefill_graphs.items()}}

    def _triton_serves(self, rows: int) -> bool:
        """Whether a decode bucket of `rows` runs rt/attention/triton_decode's kernel instead of the wrapper's:
        decided at the bucket's first launch and kept, as its skipped plans require."""
        if rows not in self._triton_buckets:
            self._triton_buckets[rows] = triton_decode.serves_geometry(
                rows=rows, q_heads=self.num_q_heads, kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                page_size=self.page_size, tensor_cores=self._tensor_cores, cuda=self.device.type == "cuda")
        return self._triton_buckets[rows]

    def _guarded(self, wrapper: Any, plan: Any) -> None:
        event = self._planned.get(id(wrapper))
        if event is not None:
            event.synchronize()  # its previous workspace copy has run: the pinned bytes may change
        plan()
        event = self._planned.setdefault(id(wrapper), torch.cuda.Event())
        event.record()

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, bufs: AttentionBuffers,
                prep: QKPrep | None = None) -> Tensor:
        if self._plan is None:
            raise RuntimeError("FlashInferAttentionBackend.forward called before plan()")
        cache = self.kv_caches[layer]
        q = self._write_kv(cache, q, k, v, bufs.slot_mapping[: q.shape[0]], prep)
        if self._plan.is_decode:
            if self._triton_serves(q.shape[0]):  # rt/attention/triton_decode (its wrapper's plan is stale)
                q = q if q.stride(-1) == 1 else q.contiguous()
                rows = q.shape[0]
                return triton_decode.decode_attention(q, cache, bufs.page_table[:rows], bufs.kv_lens[:rows],
                                                      self.scale, self._triton_workspaces.of(q))
            return self._active_decode.run(q, cache)
        wrapper, out = self._active_prefill
        if out is not None:  # captured: every row of the bucket goes in, the planned ones are written
            return wrapper.run(q, cache, out=out)
        n = self._plan.num_tokens
        out = torch.zeros_like(q)
        out[:n] = wrapper.run(q[:n], cache)
        return out

"""Warm-up and CUDA-graph capture of a program's stages: one graph per (stage, bucket), largest first, one pool.

Every launch is prepared with a plan of padded rows only (`NO_SLOT`: the scratch slot, the null
page), so warm-up and capture touch no request's state. The warm-up runs each stage eagerly at its
largest bucket and measures the activation peak the KV cache must leave room for; capture runs each
(stage, bucket) twice on the capture stream (lazy initialisation and allocator growth stay out of
the graph), then records it.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from vox_serve.core.plan import NO_SLOT, LmLaunch, StepPlan
from vox_serve.core.stages import Stage, bucket_sizes, pick_bucket
from vox_serve.rt.attention import PlanInputs
from vox_serve.rt.program import Program
from vox_serve.rt.step_writer import Launch, StepWriter

log = logging.getLogger(__name__)
CAPTURE_ORDER = (Stage.PROLOGUE, Stage.CODEC_PRIME, Stage.CODEC_FIRST, Stage.CODEC, Stage.PREFILL, Stage.DECODE)
__all__ = ["StageGraphs", "bucket_sizes", "capture_all", "pick_bucket", "plan_inputs", "warm_up"]


def plan_inputs(program: Program, stage: Stage, host_buffer: int | None = None) -> PlanInputs:
    """What the attention planner reads for an LM launch: the CSR offsets in a host buffer of the step's
    input arena (default: the current one)."""
    arena = program.arenas["step_in"]
    h = arena.host if host_buffer is None else arena.host_views(host_buffer)
    return PlanInputs(kv_indptr=h[f"{stage}_kv_indptr"], kv_last_page_len=h[f"{stage}_last_page_len"],
                      qo_indptr=h.get(f"{stage}_qo_indptr"), kv_indices=program.kv_indices.get(str(stage)),
                      max_pages_per_seq=program.limits.max_pages_per_seq)


def _padded_plan(program: Program, stage: Stage, bucket: int) -> StepPlan:
    """A plan of padded rows filling `bucket` of `stage`."""
    lim, cols = program.limits, program.meta.input_columns
    plan = StepPlan(0)
    if stage is Stage.DECODE:
        plan.decode = _rows(np.full(bucket, NO_SLOT), np.zeros(bucket), np.ones(bucket), cols)
    elif stage is Stage.PREFILL:  # sequences on the null page filling the bucket
        longest = lim.max_pages_per_seq * lim.page_size
        sizes = np.asarray([min(longest, bucket - s) for s in range(0, bucket, longest)][: lim.max_prefill_seqs])
        plan.prefill = _rows(np.full(len(sizes), NO_SLOT), np.zeros(len(sizes)), sizes, cols)
    return plan


def _rows(slot: np.ndarray, start: np.ndarray, num_tokens: np.ndarray, columns: int) -> LmLaunch:
    n, t = len(slot), int(num_tokens.sum())
    i32 = np.int32
    return LmLaunch(req_ids=["padding"] * n, slot=slot.astype(i32), start=start.astype(i32),
                    num_tokens=num_tokens.astype(i32), sample=np.zeros(n, dtype=np.bool_),
                    input_ids=np.zeros((t, columns), dtype=i32))


def prepare_launch(program: Program, writer: StepWriter, stage: Stage, bucket: int) -> Launch:
    """Fill every input of (stage, bucket) with padding, upload, and plan attention; returns the launch."""
    arena = program.arenas["step_in"]
    h = {name: view.numpy() for name, view in arena.host.items()}
    for name, view in h.items():  # nothing left from an earlier launch: every slot field is NO_SLOT
        view[...] = NO_SLOT if name.endswith("slot") else 0
    h["codec_window_end"][...] = 1
    if "codec_first_window_end" in h:
        h["codec_first_window_end"][...] = 1
    launches, _ = writer.write(h, _padded_plan(program, stage, bucket))
    launch = next((x for x in launches if x.stage is stage), Launch(stage, bucket, num_seqs=None))
    launch.bucket = bucket
    arena.upload()
    if launch.attention is not None:
        program.attention.plan(launch.attention, plan_inputs(program, stage))
    return launch


def make_writer(program: Program, buckets: dict[Stage, list[int]], captured_prefill: bool) -> StepWriter:
    return StepWriter(program.meta, program.limits, buckets, captured_prefill, program.arenas["step_in"].end_of)


def warm_up(program: Program, buckets: dict[Stage, list[int]]) -> int:
    """Run every stage eagerly at its largest bucket (and the program's eager work); returns the
    activation peak in bytes above what was allocated before."""
    dev = program.device
    writer = make_writer(program, buckets, captured_prefill=program.attention.prefill_graphs)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    with torch.inference_mode():
        for stage in CAPTURE_ORDER:
            if stage in buckets:
                bucket = max(buckets[stage])
                launch = prepare_launch(program, writer, stage, bucket)
                program.run_stage(stage, bucket, launch.num_seqs)
        program.warm_up_eager()
    torch.cuda.synchronize(dev)
    return torch.cuda.max_memory_allocated(dev) - base


class StageGraphs:
    """The captured graphs of one engine, kept alive with it."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.graphs: dict[tuple[Stage, int], torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        # a codec half on an SM partition captures on the partition's stream: its kernels then run on those SMs
        self.stream = program.partition.stream if program.partition is not None else torch.cuda.Stream(program.device)
        self.memory_bytes = 0

    def has(self, stage: Stage, bucket: int) -> bool:
        return (stage, bucket) in self.graphs

    def exec_handle(self, stage: Stage, bucket: int) -> int:
        """The graph's `cudaGraphExec_t` (what a runtime launches with cudaGraphLaunch)."""
        return int(self.graphs[(stage, bucket)].raw_cuda_graph_exec())

    def capture(self, stage: Stage, bucket: int, num_seqs: int | None) -> None:
        prog = self.program
        current = torch.cuda.current_stream(prog.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            for _ in range(2):
                prog.run_stage(stage, bucket, num_seqs)
        current.wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            prog.run_stage(stage, bucket, num_seqs)
        self.graphs[(stage, bucket)] = graph


def capture_all(program: Program, buckets: dict[Stage, list[int]]) -> StageGraphs:
    graphs = StageGraphs(program)
    writer = make_writer(program, buckets, captured_prefill=True)
    before = torch.cuda.memory_allocated(program.device)
    with torch.inference_mode():
        for stage in CAPTURE_ORDER:
            for bucket in sorted(buckets.get(stage, []), reverse=True):
                launch = prepare_launch(program, writer, stage, bucket)
                graphs.capture(stage, bucket, launch.num_seqs)
    torch.cuda.synchronize(program.device)
    graphs.memory_bytes = torch.cuda.memory_allocated(program.device) - before
    log.info("captured %d CUDA graphs (%.1f MiB)", len(graphs.graphs), graphs.memory_bytes / 2**20)
    return graphs

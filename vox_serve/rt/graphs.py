"""CUDA graphs of a program's stages: one per (stage, bucket), captured largest first into one pool.

A captured stage reads its inputs from the program's static input arena and writes its outputs
into the static output arena, so replaying it needs only the arena upload and the attention
plan that precede it. Prefill is captured per token bucket with a fixed number of sequences
(`max_prefill_seqs`, padded ones empty) when the attention backend plans it graph-statically.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from vox_serve.rt.program import Program

log = logging.getLogger(__name__)
CAPTURED_STAGES = ("prefill", "decode", "codec", "codec_first")


def run_stage(program: Program, stage: str, bucket: int, num_seqs: int | None = None) -> None:
    """Run `stage` of `program` eagerly for `bucket` rows (`codec_first`: the codec over the first-chunk
    arenas; a prefill without `num_seqs` takes the captured sequence count, `max_prefill_seqs`)."""
    if stage == "prefill":
        program.prefill(bucket, program.limits.max_prefill_seqs if num_seqs is None else num_seqs)
    elif stage == "codec_first":
        program.codec(bucket, first=True)
    else:
        getattr(program, stage)(bucket)


class StageGraphs:
    def __init__(self, program: Program) -> None:
        if program.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.program = program
        self.graphs: dict[tuple[str, int], torch.cuda.CUDAGraph] = {}
        self.memory_bytes = 0

    def has(self, stage: str, bucket: int) -> bool:
        return (stage, bucket) in self.graphs

    def replay(self, stage: str, bucket: int) -> None:
        self.graphs[(stage, bucket)].replay()

    def capture(self, buckets: dict[str, list[int]], prepare: Callable[[str, int], None]) -> None:
        """Capture every stage and bucket; `prepare(stage, bucket)` fills and plans dummy inputs."""
        prog = self.program
        before = torch.cuda.memory_allocated(prog.device)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(prog.device)
        for stage in CAPTURED_STAGES:
            for bucket in sorted(buckets.get(stage, []), reverse=True):
                prepare(stage, bucket)
                stream.wait_stream(torch.cuda.current_stream(prog.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up: lazy inits and allocator growth stay out of the graph
                        run_stage(prog, stage, bucket)
                torch.cuda.current_stream(prog.device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    run_stage(prog, stage, bucket)
                self.graphs[(stage, bucket)] = graph
        torch.cuda.synchronize(prog.device)
        self.memory_bytes = torch.cuda.memory_allocated(prog.device) - before
        log.info("captured %d CUDA graphs (%.1f MiB)", len(self.graphs), self.memory_bytes / 2**20)

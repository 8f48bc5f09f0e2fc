"""`--bench-requests N`: phases of N requests through the scheduler without HTTP, each reported by bench_report."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vox_serve import cpu_cores
from vox_serve.bench_report import BenchOutcome, BenchPhase, BenchRecorder
from vox_serve.config import VoxConfig
from vox_serve.core.request import Request
from vox_serve.engine.build import engine_of_program, load_program
from vox_serve.engine_loop import EngineLoop
from vox_serve.progress import Progress
from vox_serve.request_builder import FieldError, build_request
from vox_serve.rt.program import Program
from vox_serve.scheduler.base import QueueFull, Scheduler
from vox_serve.scheduler.factory import make_scheduler
from vox_serve.worker.disagg_worker import make_worker


def set_cpu_threads(config: VoxConfig) -> None:
    """On CPU, as many intra-op threads as there are idle cores (`cpu_cores.idle_cores`), split among the
    replicas; unless OMP_NUM_THREADS says otherwise. Oversubscribed threads make every step many times
    slower (see vox_serve/cpu_cores.py)."""
    import torch

    device = config.model.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu" or "OMP_NUM_THREADS" in os.environ:
        return
    torch.set_num_threads(max(1, cpu_cores.idle_cores() // config.server.dp_size))


def build_engine_shown(config: VoxConfig, progress: Progress) -> tuple[Program, dict[str, Any]]:
    """The engine of one replica (program and spec), its start-up stages shown as they run."""
    with progress.stage("load", f"{config.model.model} weights"):
        program = load_program(config)
    graphs = not config.engine.disable_cuda_graph and program.device.type == "cuda"
    what = "request state, KV cache" + (", warm-up and CUDA graph capture" if graphs else " (eager stages here)")
    with progress.stage("warm-up", what):
        spec = engine_of_program(program, config)
    return program, spec


def build_loop(config: VoxConfig, progress: Progress | None = None, record: bool = False,
               time_stages: bool = False) -> tuple[EngineLoop, Program]:
    """The Python runtime's loop for one replica: the engine built and captured, driven through its spec
    (`progress` shows the start-up stages as they run). The program is returned for its prompt builder
    (`preprocess`), which runs off the step path. `time_stages`: the device time of every launch (CUDA
    events; always with --trace-dir), for /metrics."""
    program, spec = build_engine_shown(config, progress or Progress())
    timed = time_stages or config.scheduler.trace_dir is not None
    worker = make_worker(spec, time_stages=timed, nvtx=config.engine.enable_nvtx)
    scheduler = make_scheduler(worker.meta, worker.limits, config.scheduler)
    return EngineLoop(scheduler, worker, nvtx=config.engine.enable_nvtx, record=record), program


def bench_fields(config: VoxConfig) -> dict[str, Any]:
    """Every bench request's fields: the text, --bench-kwargs, and --bench-audio's bytes as `audio`."""
    fields: dict[str, Any] = {"text": config.bench.text, **config.bench.kwargs}
    if config.bench.audio is not None:
        fields["audio"] = Path(config.bench.audio).read_bytes()
    return fields


class PhaseArrivals:
    """A phase's requests queued at their offsets from the phase start (`EngineLoop.run_until_idle`);
    each request's outcome records when it was queued, its audio chunks and its end."""

    def __init__(self, scheduler: Scheduler, phase: BenchPhase, requests: list[Request],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.scheduler, self.phase, self.requests, self.clock = scheduler, phase, requests, clock
        self.outcomes = [BenchOutcome(req.req_id, offset, streaming=req.streaming)
                         for req, offset in zip(requests, phase.offsets, strict=True)]
        self._by_id = {o.req_id: o for o in self.outcomes}
        self._next = 0
        self.start = clock()
        for req in requests:
            req.sink = self._sink

    def now(self) -> float:
        return self.clock() - self.start

    def _sink(self, req: Request, pcm: bytes | None, final: bool) -> None:
        outcome = self._by_id[req.req_id]
        if pcm:
            outcome.add_chunk(self.now(), pcm)
        if final:
            outcome.finished = self.now()
            outcome.finish_reason, outcome.error = req.finish_reason, req.error
            outcome.num_generated = req.num_generated

    def show(self, progress: Progress, sample_rate: int, final: bool = False) -> None:
        """The phase's progress line: requests ended, tokens generated, audio produced."""
        done = sum(o.finished is not None or o.error is not None for o in self.outcomes)
        samples = sum(len(o.pcm) for o in self.outcomes) // 2
        progress.requests(done, len(self.outcomes), sum(r.num_generated for r in self.requests),
                          sum(r.sampling.max_tokens for r in self.requests), samples / sample_rate, final)

    def admit_due(self) -> None:
        while self._next < len(self.requests) and self.phase.offsets[self._next] <= self.now():
            req, outcome = self.requests[self._next], self.outcomes[self._next]
            self._next += 1
            outcome.admitted = self.now()
            try:
                self.scheduler.add_request(req)
            except (ValueError, QueueFull) as exc:  # refused: fails this request, as in the Rust runtime
                outcome.admitted, outcome.finish_reason, outcome.error = None, "error", str(exc)

    def seconds_to_next(self) -> float | None:
        if self._next == len(self.requests):
            return None
        return max(self.phase.offsets[self._next] - self.now(), 0.0)


def phase_requests(program: Program, fields: dict[str, Any], phase: BenchPhase, greedy: bool) -> list[Request]:
    """A phase's requests, prompts built by the program (both runtimes' bench mode)."""
    return [build_request(program.meta, program.preprocess, fields, req_id, greedy, seed=seed)
            for req_id, seed in zip(phase.req_ids, phase.seeds, strict=True)]


def run_bench(config: VoxConfig) -> int:
    t0 = time.perf_counter()
    set_cpu_threads(config)
    progress = Progress()
    loop, program = build_loop(config, progress)
    meta = program.meta
    print(f"model {meta.name} ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    try:
        fields = bench_fields(config)
    except OSError as exc:
        print(f"vox-serve: error: --bench-audio: {exc}", file=sys.stderr)
        return 2
    recorder = BenchRecorder(config, meta.name, meta.sample_rate)
    for phase in recorder.phases:
        try:
            requests = phase_requests(program, fields, phase, config.bench.greedy)
        except FieldError as exc:
            print(f"vox-serve: error: --bench-kwargs/--bench-text: {exc}", file=sys.stderr)
            return 2
        arrivals = PhaseArrivals(loop.scheduler, phase, requests)
        show = functools.partial(arrivals.show, progress, meta.sample_rate)
        loop.run_until_idle(on_poll=show, arrivals=arrivals)
        show(final=True)
        recorder.phase_done(phase.index, arrivals.outcomes, arrivals.now())
    return recorder.finish()

"""`--bench-requests N`: N concurrent requests through the scheduler without HTTP, then a report."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from vox_serve.audio import write_wav
from vox_serve.config import VoxConfig
from vox_serve.core.request import Request
from vox_serve.engine.build import engine_of_program, load_program
from vox_serve.engine_loop import EngineLoop
from vox_serve.progress import Progress
from vox_serve.request_builder import FieldError, build_request
from vox_serve.rt.program import Program
from vox_serve.scheduler.factory import make_scheduler
from vox_serve.worker.disagg_worker import make_worker


def set_cpu_threads(config: VoxConfig) -> None:
    """On CPU, as many intra-op threads as there are idle cores (those the load average leaves), split
    among the replicas; unless OMP_NUM_THREADS says otherwise. Oversubscribed threads make every step
    many times slower: the README's main job ran 17x longer with 2 threads than with 1 on a loaded
    2-core machine."""
    import torch

    device = config.model.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu" or "OMP_NUM_THREADS" in os.environ:
        return
    cores = os.cpu_count() or 1
    idle = cores - int(os.getloadavg()[0]) if hasattr(os, "getloadavg") else cores
    torch.set_num_threads(max(1, min(cores, idle) // config.server.dp_size))


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


def run_bench(config: VoxConfig) -> int:
    t0 = time.perf_counter()
    set_cpu_threads(config)
    progress = Progress()
    loop, program = build_loop(config, progress)
    meta = program.meta
    print(f"model {meta.name} ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    audio: dict[str, list[bytes]] = {}

    def sink(req: Request, pcm: bytes | None, final: bool) -> None:
        if pcm:
            audio[req.req_id].append(pcm)

    try:
        fields = bench_fields(config)
    except OSError as exc:
        print(f"vox-serve: error: --bench-audio: {exc}", file=sys.stderr)
        return 2
    requests = []
    for i in range(config.bench.num_requests):
        req_id = f"bench-{i:03d}"
        try:
            req = build_request(meta, program.preprocess, fields, req_id, config.bench.greedy,
                                seed=config.model.seed + i)
        except FieldError as exc:
            print(f"vox-serve: error: --bench-kwargs/--bench-text: {exc}", file=sys.stderr)
            return 2
        req.sink = sink
        audio[req_id] = []
        requests.append(req)
    start = time.perf_counter()
    for req in requests:
        loop.scheduler.add_request(req)

    def show(final: bool = False) -> None:
        done = sum(r.status.is_done for r in requests)
        samples = sum(len(pcm) for chunks in audio.values() for pcm in chunks) // 2
        progress.requests(done, len(requests), sum(r.num_generated for r in requests),
                          sum(r.sampling.max_tokens for r in requests), samples / meta.sample_rate, final)

    loop.run_until_idle(on_poll=show)
    show(final=True)
    wall = time.perf_counter() - start
    return _report(config, requests, audio, wall, meta.sample_rate)


def _report(config: VoxConfig, requests: list[Request], audio: dict[str, list[bytes]], wall: float,
            sample_rate: int) -> int:
    out_dir = Path(config.bench.out_dir) if config.bench.out_dir else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    total_audio = 0.0
    print(f"{'request':<10} {'ttfa_ms':>9} {'latency_s':>10} {'audio_s':>8} {'tokens':>7}  finish")
    for req in requests:
        pcm = b"".join(audio[req.req_id])
        seconds = len(pcm) / 2 / sample_rate
        total_audio += seconds
        s = req.stats
        ttfa = f"{(s.first_audio - s.arrival) * 1000:9.1f}" if s.first_audio is not None else f"{'-':>9}"
        latency = (s.finished or s.arrival) - s.arrival
        reason = req.finish_reason if req.error is None else f"{req.finish_reason} ({req.error})"
        print(f"{req.req_id:<10} {ttfa} {latency:10.2f} {seconds:8.2f} {req.num_generated:7d}  {reason}")
        if out_dir is not None:
            write_wav(out_dir / f"{req.req_id}.wav", pcm, sample_rate)
    print(f"total audio {total_audio:.2f}s in {wall:.2f}s wall: RTF {total_audio / wall:.2f}x real time"
          f" ({len(requests)} requests)")
    failed = [r for r in requests if r.error is not None]
    return 1 if failed else 0

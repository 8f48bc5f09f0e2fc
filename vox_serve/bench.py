"""`--bench-requests N`: N concurrent requests through the scheduler without HTTP, then a report."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from vox_serve.audio import write_wav
from vox_serve.config import VoxConfig
from vox_serve.core.request import Request
from vox_serve.engine import build_engine, get_engine
from vox_serve.engine_loop import EngineLoop
from vox_serve.request_builder import FieldError, build_request
from vox_serve.rt.program import Program
from vox_serve.scheduler.factory import make_scheduler
from vox_serve.worker.engine_worker import EngineWorker


def build_loop(config: VoxConfig, record: bool = False, time_stages: bool = False) -> tuple[EngineLoop, Program]:
    """The Python runtime's loop for one replica: the engine built and captured, driven through its spec.
    The program is returned for its prompt builder (`preprocess`), which runs off the step path.
    `time_stages`: device time of every launch (CUDA events; always with --trace-dir), for /metrics."""
    spec = build_engine(config)
    timed = time_stages or config.scheduler.trace_dir is not None
    worker = EngineWorker(spec, time_stages=timed, nvtx=config.engine.enable_nvtx)
    scheduler = make_scheduler(worker.meta, worker.limits, config.scheduler)
    loop = EngineLoop(scheduler, worker, nvtx=config.engine.enable_nvtx, record=record)
    return loop, get_engine(spec["engine_id"]).program


def run_bench(config: VoxConfig) -> int:
    t0 = time.perf_counter()
    loop, program = build_loop(config)
    meta = program.meta
    print(f"model {meta.name} ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    audio: dict[str, list[bytes]] = {}

    def sink(req: Request, pcm: bytes | None, final: bool) -> None:
        if pcm:
            audio[req.req_id].append(pcm)

    fields = {"text": config.bench.text, **config.bench.kwargs}
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
    loop.run_until_idle()
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

"""Bench mode's phases and report, one implementation for both runtimes.

`--bench-rate R1,R2,...` makes each rate a phase of `--bench-requests N` requests on the same engine,
run after the previous phase has drained: Poisson arrivals at that rate (`metrics.arrival_times`,
seeded from `--seed`, offsets from the phase start), or all at once for a rate of 0 or inf (and
without the flag). The runtime runs a phase's requests, admitting each at its offset, and hands back
a `BenchOutcome` per request; `BenchRecorder` prints the per-request lines, the phase's summary
(`metrics.summarize`: TTFA measured from each request's own arrival, viability, underruns,
throughput) and RTF, writes the WAVs, and with `--bench-json` the summaries as one JSON file.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vox_serve.audio import write_wav
from vox_serve.config import BenchConfig, ConfigError, VoxConfig
from vox_serve.metrics import RequestTrace, Summary, arrival_times, summarize, viability

POISSON_SHAPE = 1.0  # Gamma gaps of shape 1: exponential, as benchmark/load.py's default


def environment() -> dict[str, str]:
    """What every benchmark result records: the exact command, the git commit, the GPU and the time."""

    def cmd(*args: str) -> str:
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    # VOX_GIT_COMMIT wins: the GPU machine's copy of the tree may carry a stale .git of its own.
    commit = os.environ.get("VOX_GIT_COMMIT") or cmd("git", "rev-parse", "--verify", "-q", "HEAD") or "unknown"
    return {"command": shlex.join([Path(sys.executable).name, *sys.argv]), "git_commit": commit,
            "gpu": cmd("nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


@dataclass(frozen=True)
class BenchPhase:
    """One phase: its requests' names and seeds, and their arrival offsets (s) from the phase start."""

    index: int
    rate: float  # requests per second; 0: all at once
    req_ids: tuple[str, ...]
    seeds: tuple[int, ...]
    offsets: tuple[float, ...]

    @property
    def what(self) -> str:
        arrivals = "all at once" if self.rate == 0 else f"Poisson arrivals at {self.rate:g}/s"
        return f"phase {self.index}: {len(self.req_ids)} requests, {arrivals}"


def phase_requests(bench: BenchConfig, rate: float) -> int:
    """The requests of a phase at `rate` (0: all at once): `--bench-requests N`, or with `--bench-duration S` a
    Poisson phase's `rate x S` (at least 1), so that it loads the engine for S seconds whatever the rate."""
    if rate == 0 or bench.duration_s is None:
        return bench.num_requests
    return max(1, round(rate * bench.duration_s))


def bench_phases(config: VoxConfig) -> list[BenchPhase]:
    """The phases of a bench run. One phase keeps the names `bench-000` ...; phase k of several names its
    requests `bench-p<k>-000` ... so that their WAVs do not overwrite each other."""
    bench = config.bench
    rates = bench.rates or (0.0,)
    phases = []
    for k, rate in enumerate(rates):
        n = phase_requests(bench, rate)
        prefix = "bench-" if len(rates) == 1 else f"bench-p{k}-"
        offsets = [0.0] * n if rate == 0 else arrival_times(n, rate, POISSON_SHAPE, config.model.seed)
        phases.append(BenchPhase(index=k, rate=rate, req_ids=tuple(f"{prefix}{i:03d}" for i in range(n)),
                                 seeds=tuple(config.model.seed + i for i in range(n)), offsets=tuple(offsets)))
    return phases


@dataclass
class BenchOutcome:
    """One request of a phase as the runtime saw it; times are seconds from the phase start."""

    req_id: str
    offset: float  # its scheduled arrival
    streaming: bool = True
    replica: int = 0  # the replica that served it (Rust runtime, --dp-size)
    admitted: float | None = None  # when the scheduler queued it (None: refused)
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples) per audio chunk
    pcm: bytes | bytearray = field(default_factory=bytearray)  # bytes from the Rust runtime
    finished: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    num_generated: int = 0

    def add_chunk(self, when: float, pcm: bytes) -> None:
        self.chunks.append((when, len(pcm) // 2))
        self.pcm += pcm

    @property
    def ttfa(self) -> float | None:
        """Seconds from its own arrival (not the phase start) to its first audio."""
        return self.chunks[0][0] - self.offset if self.chunks else None

    def trace(self) -> RequestTrace:
        failed = self.error is not None or self.finished is None
        return RequestTrace(self.req_id, sent=self.offset, streaming=self.streaming, chunks=list(self.chunks),
                            finished=self.finished, error=(self.error or "did not finish") if failed else None)


def _finite(value: Any) -> Any:
    """NaN and infinities as null: JSON has no such numbers."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class BenchRecorder:
    """Reports each phase as it ends and keeps the JSON of every phase (rewritten after each, so a run
    stopped by a timeout keeps the phases it finished)."""

    def __init__(self, config: VoxConfig, model_name: str, sample_rate: int) -> None:
        self.config, self.sample_rate = config, sample_rate
        self.phases = bench_phases(config)
        self.out_dir = Path(config.bench.out_dir) if config.bench.out_dir else None
        self.num_failed = 0
        recorded = environment() if config.bench.json_path else {}  # subprocesses (git, nvidia-smi) for the JSON only
        self.result: dict[str, Any] = {
            **recorded, "runtime": config.runtime, "model": config.model.model, "model_name": model_name,
            "request": {"text": config.bench.text, **config.bench.kwargs}, "seed": config.model.seed,
            "num_requests": config.bench.num_requests, "phase_duration_s": config.bench.duration_s, "phases": []}
        self._write_json()  # an unwritable --bench-json fails before the first phase, not after it

    def phase_done(self, index: int, outcomes: list[BenchOutcome], wall: float) -> None:
        phase = self.phases[index]
        if self.config.bench.rates:
            print(phase.what)
        self._print_requests(outcomes)
        summary = summarize([o.trace() for o in outcomes], self.sample_rate)
        audio = sum(len(o.pcm) for o in outcomes) / 2 / self.sample_rate
        print(summary_line(summary))
        if self.config.server.dp_size > 1:
            served = Counter(o.replica for o in outcomes)
            print("replicas: " + ", ".join(f"{r}: {served[r]} requests" for r in range(self.config.server.dp_size)))
        print(f"total audio {audio:.2f}s in {wall:.2f}s wall: RTF {audio / wall:.2f}x real time"
              f" ({len(outcomes)} requests)", flush=True)
        self.num_failed += sum(o.error is not None for o in outcomes)
        self.result["phases"].append({
            "phase": index, "rate": phase.rate or None, "num_requests": len(outcomes), "wall_s": wall,
            "rtf": audio / wall, **{k: _finite(v) for k, v in asdict(summary).items()},
            "requests": [self._request_json(o) for o in outcomes]})
        self._write_json()

    def finish(self) -> int:
        """The exit status: 1 when a request failed."""
        return 1 if self.num_failed else 0

    def _print_requests(self, outcomes: list[BenchOutcome]) -> None:
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        width = max([10, *(len(o.req_id) + 1 for o in outcomes)])
        print(f"{'request':<{width}} {'ttfa_ms':>9} {'latency_s':>10} {'audio_s':>8} {'tokens':>7}  finish")
        for o in outcomes:
            seconds = len(o.pcm) / 2 / self.sample_rate
            ttfa = f"{o.ttfa * 1000:9.1f}" if o.ttfa is not None else f"{'-':>9}"
            latency = (o.offset if o.finished is None else o.finished) - o.offset
            reason = o.finish_reason if o.error is None else f"{o.finish_reason} ({o.error})"
            print(f"{o.req_id:<{width}} {ttfa} {latency:10.2f} {seconds:8.2f} {o.num_generated:7d}  {reason}")
            if self.out_dir is not None:
                write_wav(self.out_dir / f"{o.req_id}.wav", bytes(o.pcm), self.sample_rate)

    def _request_json(self, o: BenchOutcome) -> dict[str, Any]:
        return {"req_id": o.req_id, "replica": o.replica, "offset_s": o.offset, "admitted_s": o.admitted,
                "first_audio_s": o.chunks[0][0] if o.chunks else None, "ttfa_s": o.ttfa, "finished_s": o.finished,
                "audio_s": len(o.pcm) / 2 / self.sample_rate, "num_chunks": len(o.chunks),
                "viability": viability(o.chunks, self.sample_rate), "tokens": o.num_generated,
                "finish": o.finish_reason, "error": o.error}

    def _write_json(self) -> None:
        path = self.config.bench.json_path
        if path is None:
            return
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(self.result, indent=1, allow_nan=False))
        except OSError as exc:
            raise ConfigError(f"--bench-json {path}: {exc}") from exc


def summary_line(s: Summary) -> str:
    """A phase's summary in one line (TTFA over streaming requests, from each one's own arrival)."""

    def ms(seconds: float) -> str:
        return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}ms"

    return (f"summary: {s.num_completed}/{s.num_requests} done, {s.num_failed} failed; ttfa p50 {ms(s.ttfa_p50)} "
            f"p95 {ms(s.ttfa_p95)} p99 {ms(s.ttfa_p99)}; viability {s.viability:.1f}% all-chunks {s.all_chunks:.1f}% "
            f"underruns {s.underruns}; throughput {s.throughput:.2f}x")

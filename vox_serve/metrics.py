"""What users feel, measured from the client's side (pure Python; shared by every benchmark).

Definitions (DESIGN.md):
- TTFA: from sending the request to receiving the first PCM bytes.
- Chunk i (i >= 1) is on time when the audio received before it is longer than the time since the
  first chunk arrived (the client plays from the first chunk on, without pausing). Per-request
  viability is the percentage of chunks on time (chunk 0 and a one-chunk stream count as on
  time); "all chunks" is 100 when every chunk is on time, else 0.
- An underrun is a chunk that is not on time.
- Throughput (RTF): audio seconds produced per wall second.
- Arrivals of an open-loop load: Gamma-distributed gaps (shape 1 = Poisson), offsets from its start.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class RequestTrace:
    """One request as its client saw it: when it was sent and when each chunk of audio arrived."""

    req_id: str
    sent: float
    streaming: bool = True
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival time, samples)
    finished: float | None = None
    error: str | None = None

    def add_chunk(self, arrival: float, num_samples: int) -> None:
        self.chunks.append((arrival, num_samples))

    @property
    def num_samples(self) -> int:
        return sum(n for _, n in self.chunks)


def arrival_times(n: int, rate: float, shape: float, seed: int) -> list[float]:
    """Offsets (s) of n arrivals with Gamma(shape, 1/(rate*shape)) gaps: mean gap 1/rate, the first at 0."""
    if not rate > 0 or not shape > 0 or math.isinf(rate):
        raise ValueError(f"arrival rate {rate} and shape {shape} must be finite and > 0")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(shape, 1.0 / (rate * shape))
    return out


def ttfa(trace: RequestTrace) -> float | None:
    """Seconds from sending to the first audio (None when no audio arrived)."""
    return trace.chunks[0][0] - trace.sent if trace.chunks else None


def chunks_on_time(chunks: Sequence[tuple[float, int]], sample_rate: int) -> list[bool]:
    """Whether each chunk i >= 1 arrived before the client ran out of the audio before it."""
    if not chunks:
        return []
    start = chunks[0][0]
    received = chunks[0][1]
    on_time = []
    for arrival, samples in chunks[1:]:
        on_time.append(received / sample_rate > arrival - start)
        received += samples
    return on_time


def viability(chunks: Sequence[tuple[float, int]], sample_rate: int) -> float:
    """Percentage of chunks on time (100 for zero or one chunk)."""
    flags = chunks_on_time(chunks, sample_rate)
    return 100.0 * sum(flags) / len(flags) if flags else 100.0


def all_chunks_viable(chunks: Sequence[tuple[float, int]], sample_rate: int) -> float:
    """100 when every chunk is on time, else 0."""
    return 100.0 if all(chunks_on_time(chunks, sample_rate)) else 0.0


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default)."""
    data = sorted(values)
    if not data:
        return math.nan
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    num_requests: int
    num_completed: int
    num_failed: int
    ttfa_p50: float
    ttfa_p90: float
    ttfa_p95: float
    ttfa_p99: float
    latency_p90: float  # send to completion, every completed request
    viability: float  # mean per-request % of chunks on time (streaming requests)
    all_chunks: float  # % of streaming requests with every chunk on time
    underruns: int  # late chunks over all streaming requests
    audio_seconds: float
    duration: float  # first send to last completion
    throughput: float  # audio seconds per second (RTF)
    requests_per_second: float


def summarize(traces: Sequence[RequestTrace], sample_rate: int) -> Summary:
    """Aggregate metrics. TTFA and viability are over streaming requests (a non-streaming request's
    audio arrives in one piece at completion: its latency); throughput over all completed ones."""
    done = [t for t in traces if t.error is None and t.finished is not None]
    streams = [t for t in done if t.streaming and t.chunks]
    ttfas = [ttfa(t) for t in streams]
    latencies = [t.finished - t.sent for t in done]
    audio = sum(t.num_samples for t in done) / sample_rate
    start = min((t.sent for t in traces), default=0.0)
    end = max((t.finished for t in done), default=start)
    duration = max(end - start, 1e-9)
    late = sum(flag is False for t in streams for flag in chunks_on_time(t.chunks, sample_rate))
    return Summary(
        num_requests=len(traces), num_completed=len(done), num_failed=len(traces) - len(done),
        ttfa_p50=percentile(ttfas, 50), ttfa_p90=percentile(ttfas, 90), ttfa_p95=percentile(ttfas, 95),
        ttfa_p99=percentile(ttfas, 99),
        latency_p90=percentile(latencies, 90),
        viability=_mean(viability(t.chunks, sample_rate) for t in streams),
        all_chunks=_mean(all_chunks_viable(t.chunks, sample_rate) for t in streams),
        underruns=late, audio_seconds=audio, duration=duration, throughput=audio / duration,
        requests_per_second=len(done) / duration,
    )


def _mean(values: Iterable[float]) -> float:
    data = list(values)
    return sum(data) / len(data) if data else math.nan

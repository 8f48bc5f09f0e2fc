"""GET /metrics: Prometheus metrics per replica (prometheus-client, one registry per app).

From the API process, which sees every request's events as the client will: time to first audio
(from the request's submission), gaps between consecutive chunks, underruns (a chunk that arrives
after the audio before it has played out, as `vox_serve.metrics` defines them), audio seconds
produced, each finished request's RTF (audio seconds per wall second) and the replica's RTF over
the last RTF_WINDOW_S, and requests by outcome. From each replica's last Stats report: queue depth,
running requests, KV pages and codec slots in use, and step time by stage.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from starlette.responses import Response

from vox_serve import ipc
from vox_serve.api.replica_state import RequestHandle
from vox_serve.api.replicas import ReplicaManager
from vox_serve.stage_stats import STAGE_BUCKETS_S

router = APIRouter(tags=["Metrics"])
RTF_WINDOW_S = 10.0
TTFA_BUCKETS_S = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
GAP_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)
RTF_BUCKETS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0)


@dataclass
class _Track:
    """One request's stream so far, as its client receives it."""

    first: float | None = None
    last: float | None = None
    num_samples: int = 0


class ServerMetrics:
    def __init__(self, manager: ReplicaManager) -> None:
        self.manager = manager
        self.registry = CollectorRegistry()
        r, label = self.registry, ["replica"]
        self.ttfa = Histogram("vox_ttfa_seconds", "Time from submission to a request's first audio", label,
                              buckets=TTFA_BUCKETS_S, registry=r)
        self.chunk_gap = Histogram("vox_chunk_gap_seconds", "Time between consecutive audio chunks of a request",
                                   label, buckets=GAP_BUCKETS_S, registry=r)
        self.underruns = Counter("vox_underruns", "Chunks that arrived after the audio before them had played",
                                 label, registry=r)
        self.audio_seconds = Counter("vox_audio_seconds", "Audio produced", label, registry=r)
        self.request_rtf = Histogram("vox_request_rtf", "Audio seconds per wall second of each finished request",
                                     label, buckets=RTF_BUCKETS, registry=r)
        self.requests = Counter("vox_requests", "Requests by outcome (finished, aborted, or the error type)",
                                ["replica", "outcome"], registry=r)
        self.registry.register(_ReplicaCollector(self))
        for replica in range(len(manager.replicas)):  # every series exists from the start, at zero
            for metric in (self.ttfa, self.chunk_gap, self.underruns, self.audio_seconds, self.request_rtf):
                metric.labels(str(replica))
        self._tracks: dict[str, _Track] = {}
        self._recent: dict[int, deque[tuple[float, float]]] = {}  # replica -> (arrival, audio seconds)

    def on_event(self, handle: RequestHandle, event: Any) -> None:
        if not handle.counted:
            return
        replica, now = str(handle.replica), time.monotonic()
        if isinstance(event, ipc.Audio):
            self._on_audio(handle, replica, now, len(event.pcm) // 2)
        elif isinstance(event, ipc.Finished | ipc.Failed | ipc.Abort):
            track = self._tracks.pop(handle.req_id, None)
            outcome = {ipc.Finished: "finished", ipc.Abort: "aborted"}.get(type(event)) or event.code
            self.requests.labels(replica, outcome).inc()
            if isinstance(event, ipc.Finished) and track is not None and track.num_samples:
                wall = max(now - handle.opened, 1e-6)
                self.request_rtf.labels(replica).observe(track.num_samples / self._rate() / wall)

    def _rate(self) -> int:
        meta = self.manager.meta
        return meta.sample_rate if meta is not None else 24000

    def _on_audio(self, handle: RequestHandle, replica: str, now: float, num_samples: int) -> None:
        track = self._tracks.setdefault(handle.req_id, _Track())
        seconds = num_samples / self._rate()
        if track.first is None:
            track.first = now
            self.ttfa.labels(replica).observe(now - handle.opened)
        else:
            self.chunk_gap.labels(replica).observe(now - track.last)
            if track.num_samples / self._rate() <= now - track.first:
                self.underruns.labels(replica).inc()
        track.last = now
        track.num_samples += num_samples
        self.audio_seconds.labels(replica).inc(seconds)
        recent = self._recent.setdefault(handle.replica, deque())
        recent.append((now, seconds))
        while recent and recent[0][0] < now - RTF_WINDOW_S:
            recent.popleft()

    def rtf(self, replica: int, now: float) -> float:
        """Audio seconds produced per wall second over the last RTF_WINDOW_S."""
        recent = self._recent.get(replica, ())
        return sum(s for t, s in recent if t >= now - RTF_WINDOW_S) / RTF_WINDOW_S


class _ReplicaCollector:
    """Gauges and stage-time histograms from each replica's last Stats report."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        now = time.monotonic()
        gauges = {name: GaugeMetricFamily(f"vox_{name}", text, labels=["replica"]) for name, text in (
            ("queue_depth", "Requests waiting for admission"), ("running_requests", "Requests generating tokens"),
            ("active_requests", "Requests the scheduler holds"), ("in_flight_requests", "Requests of this server"),
            ("input_sessions", "Input-streaming sessions receiving text"), ("replica_up", "1 while ready"),
            ("rtf", f"Audio seconds produced per wall second over the last {RTF_WINDOW_S:g} s"))}
        pools = GaugeMetricFamily("vox_pool_used", "KV pages and codec slots in use", labels=["replica", "pool"])
        sizes = GaugeMetricFamily("vox_pool_size", "KV pages and codec slots in all", labels=["replica", "pool"])
        stages = HistogramMetricFamily("vox_step_stage_seconds", "Time of one stage launch",
                                       labels=["replica", "stage"])
        for replica in self.metrics.manager.replicas:
            label, s = str(replica.index), replica.stats
            gauges["replica_up"].add_metric([label], float(replica.state == "ready"))
            gauges["in_flight_requests"].add_metric([label], len(replica.in_flight))
            gauges["rtf"].add_metric([label], self.metrics.rtf(replica.index, now))
            if s is None:
                continue
            for name, value in (("queue_depth", s.num_waiting), ("running_requests", s.num_running),
                                ("active_requests", s.num_active), ("input_sessions", s.num_sessions)):
                gauges[name].add_metric([label], value)
            for pool, (free, total) in s.pools.items():
                pools.add_metric([label, pool], total - free)
                sizes.add_metric([label, pool], total)
            for stage, row in s.stage_times.items():
                stages.add_metric([label, stage], _buckets(row[2:]), row[1])
        yield from (*gauges.values(), pools, sizes, stages)


def _buckets(counts: list[float]) -> list[tuple[str, float]]:
    """Per-bucket counts -> Prometheus' cumulative (upper bound, count) pairs, +Inf last."""
    out, total = [], 0.0
    for bound, count in zip([*map(str, STAGE_BUCKETS_S), "+Inf"], counts, strict=True):
        total += count
        out.append((bound, total))
    return out


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

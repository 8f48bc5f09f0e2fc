"""Run a workload through a scheduling policy on the simulated engine and measure what clients feel.

The driver plays the clients: it sends each request at its arrival time, records every chunk's
arrival on the virtual clock, and summarises with vox_serve.metrics, the same code the HTTP load
benchmark uses. When nothing can run, the clock jumps to the next arrival or to the time a policy
holding audio back wants to run again.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vox_serve.config import SchedulerConfig
from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.request import Prompt, Request, SamplingParams, TextFeed
from vox_serve.engine_loop import EngineLoop
from vox_serve.metrics import RequestTrace, Summary, summarize
from vox_serve.scheduler.base import QueueFull, Scheduler
from vox_serve.scheduler.factory import make_scheduler
from vox_serve.sim.clock import VirtualClock
from vox_serve.sim.cost import CostModel, Profile
from vox_serve.sim.worker import TEXT_END_ID, TEXT_ID_BASE, SimStats, SimWorker
from vox_serve.sim.workload import Arrival
from vox_serve.trace import Tracer


@dataclass(frozen=True)
class EngineOptions:
    """The simulated engine's limits (the flags of the same names)."""

    max_batch: int = 256
    max_codec_batch: int = 128
    max_prefill_tokens: int = 2048
    max_prefill_seqs: int = 16
    frames_per_chunk: int | None = None  # None: the model's
    page_size: int = 16
    num_pages: int | None = None  # None: max_batch sequences of max_model_len
    max_model_len: int | None = None  # None: the model's

    def limits(self, meta: ProgramMeta) -> EngineLimits:
        max_len = self.max_model_len or meta.max_model_len
        streams = meta.layout.kv_streams  # paired rows: a page per stream
        pages = self.num_pages or self.max_batch * streams * -(-max_len // self.page_size)
        return EngineLimits(
            max_batch=self.max_batch, max_prefill_tokens=self.max_prefill_tokens,
            max_prefill_seqs=min(self.max_prefill_seqs, self.max_batch), max_codec_batch=self.max_codec_batch,
            frames_per_chunk=self.frames_per_chunk or meta.frames_per_chunk, num_pages=pages + 1,
            page_size=self.page_size, max_model_len=max_len, kv_streams=streams,
        )


def scheduler_config(policy: str, costs: CostModel, limits: EngineLimits, **overrides: Any) -> SchedulerConfig:
    """The policy's config; `deadline_*_ms` estimates come from the cost model unless given."""
    fields = {"scheduler_type": policy, "max_batch_size": limits.max_batch,
              "max_prefill_tokens": limits.max_prefill_tokens, "max_prefill_seqs": limits.max_prefill_seqs,
              "max_codec_batch": limits.max_codec_batch, "detokenize_interval": limits.frames_per_chunk,
              "max_queued_requests": 1 << 30, **costs.deadline_estimates(limits)}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return SchedulerConfig(**fields)


@dataclass
class SimRun:
    policy: str
    traces: list[RequestTrace]
    summary: Summary
    stats: SimStats
    num_steps: int
    virtual_seconds: float
    wall_seconds: float


StepHook = Callable[[Scheduler, SimWorker], None]


class Simulation:
    """One policy, one workload: build with `Simulation(...)`, run with `run()`."""

    def __init__(self, profile: Profile, config: SchedulerConfig, limits: EngineLimits, arrivals: list[Arrival],
                 trace_dir: str | None = None, on_step: StepHook | None = None, check_pages: bool = True,
                 record: bool = False) -> None:
        self.profile, self.meta = profile, profile.meta
        self.clock = VirtualClock()
        self.scheduler = make_scheduler(self.meta, limits, dataclasses.replace(config, trace_dir=None), self.clock)
        self.worker = SimWorker(self.meta, limits, profile.costs, self.clock, check_pages=check_pages)
        tracer = Tracer(trace_dir, timer="sim") if trace_dir else None
        self.loop = EngineLoop(self.scheduler, self.worker, tracer=tracer, record=record)
        self.arrivals = deque(sorted(arrivals, key=lambda a: a.t))
        self.texts: list[tuple[float, str, int, bool]] = []  # pending text: (time, req_id, ids, ends)
        self.traces: dict[str, RequestTrace] = {}
        self.requests: dict[str, Request] = {}
        self.on_step = on_step

    def run(self) -> SimRun:
        wall = time.perf_counter()
        while self.arrivals or self.loop.busy:
            while self.arrivals and self.arrivals[0].t <= self.clock.now():
                self._send(self.arrivals.popleft())
            self._send_text()
            if self.loop.step():
                if self.on_step is not None:
                    self.on_step(self.scheduler, self.worker)
                continue
            self._wait()
        if self.loop.tracer is not None:
            self.loop.tracer.close()
        traces = list(self.traces.values())
        return SimRun(self.scheduler.name, traces, summarize(traces, self.meta.sample_rate), self.worker.stats,
                      self.loop.num_steps, self.clock.now(), time.perf_counter() - wall)

    def _wait(self) -> None:
        """Nothing ran: jump to the next event, or fail the queue's head if none will come."""
        times = [t for t in (self.arrivals[0].t if self.arrivals else None, self.scheduler.next_wakeup(),
                             min((e[0] for e in self.texts), default=None)) if t is not None]
        if times:
            self.clock.advance_to(min(times))
        elif self.scheduler.waiting:
            self.scheduler.abort(self.scheduler.waiting[0].req_id, "stalled: the KV cache cannot hold this request")
        else:
            raise RuntimeError(f"simulation stalled with {self.scheduler.num_active} requests and nothing to run")

    def _send(self, a: Arrival) -> None:
        cps, cpf = self.meta.codes_per_step, self.meta.codes_per_frame
        tokens = -(-a.num_frames * cpf // cps)
        sampling = SamplingParams(temperature=0.0, repetition_penalty=1.0, ignore_eos=a.ignore_eos,
                                  max_tokens=a.max_tokens or tokens + cpf, seed=len(self.traces))
        prompt = Prompt.of([[1] * self.meta.input_columns] * a.prompt_len)
        req = Request(a.req_id, prompt, sampling, streaming=a.streaming)
        if a.text_end is not None:
            req.text_feed = TextFeed()
            self.texts += [(t, a.req_id, n, False) for t, n in a.text_pieces] + [(a.text_end, a.req_id, 0, True)]
            self.worker.set_text(a.req_id, sum(n for _, n in a.text_pieces))
        trace = self.traces[a.req_id] = RequestTrace(a.req_id, a.t, a.streaming)
        req.sink = self._sink(trace)
        self.worker.set_length(a.req_id, a.num_frames)
        try:
            self.scheduler.add_request(req)
        except (QueueFull, ValueError) as exc:
            trace.finished, trace.error = self.clock.now(), str(exc)
            return
        req.stats.arrival = a.t  # sent during the step that was running: its client's clock counts from then
        self.requests[a.req_id] = req

    def _send_text(self) -> None:
        """Deliver the text pieces that are due, in order (ids numbered per request, as the worker expects)."""
        due = sorted((e for e in self.texts if e[0] <= self.clock.now()), key=lambda e: (e[0], e[3]))
        self.texts = [e for e in self.texts if e[0] > self.clock.now()]
        for _, req_id, n, ends in due:
            req = self.requests.get(req_id)
            if req is None or req.text_feed is None:
                continue  # refused at arrival
            first = TEXT_ID_BASE + len(req.text_feed.ids)
            self.scheduler.append_text(req_id, list(range(first, first + n)) + ([TEXT_END_ID] if ends else []), ends)

    def _sink(self, trace: RequestTrace) -> Callable[[Request, bytes | None, bool], None]:
        def sink(req: Request, pcm: bytes | None, final: bool) -> None:
            if pcm:
                trace.add_chunk(self.clock.now(), len(pcm) // 2)
            if final:
                trace.finished, trace.error = self.clock.now(), req.error
        return sink


def simulate(profile: Profile, policy: str, arrivals: list[Arrival], engine: EngineOptions | None = None,
             trace_dir: str | None = None, on_step: StepHook | None = None, check_pages: bool = True,
             **config: Any) -> SimRun:
    """Run `arrivals` through `policy`; `config` overrides SchedulerConfig fields (async_scheduling, ...)."""
    limits = (engine or EngineOptions()).limits(profile.meta)
    cfg = scheduler_config(policy, profile.costs, limits, **config)
    return Simulation(profile, cfg, limits, arrivals, trace_dir, on_step, check_pages).run()

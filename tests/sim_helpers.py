"""Helpers for scheduler tests on the simulated engine: a small model geometry and scripted runs."""

from __future__ import annotations

import dataclasses

from vox_serve.config import SchedulerConfig
from vox_serve.core.meta import EngineLimits, ProgramMeta, StopRule
from vox_serve.core.plan import StepPlan
from vox_serve.core.request import Prompt, Request, RequestStatus, SamplingParams
from vox_serve.scheduler.base import Scheduler
from vox_serve.scheduler.factory import make_scheduler
from vox_serve.sim.clock import VirtualClock
from vox_serve.sim.cost import CostModel, Curve, Profile
from vox_serve.sim.worker import SimWorker

SR = 1000  # 1000 samples/s and 100 samples a frame: a frame is 0.1 s of audio

META = ProgramMeta(
    name="toy", sample_rate=SR, input_columns=1, codes_per_step=1, codes_per_frame=2, samples_per_frame=100,
    frames_per_chunk=2, codec_lookback_frames=1, codec_lookahead_frames=1, skip_leading_frames=1,
    max_model_len=256, max_text_chars=100, stop_rule=StopRule(token=0, at_frame_boundary=True), default_sampling={},
    accepted_fields=("text",),
)
COSTS = CostModel(decode_ms=Curve.of([[1, 10.0], [64, 20.0]]), prefill_ms=Curve.of([[1, 5.0], [1024, 50.0]]),
                  codec_ms=Curve.of([[1, 2.0], [64, 10.0]]), host_ms_per_step=0.5, host_ms_per_row=0.01)
PROFILE = Profile("toy", META, COSTS, {"meta": dataclasses.asdict(META)})


def limits(max_batch: int = 8, num_pages: int = 64, page_size: int = 4, max_codec_batch: int = 8,
           max_prefill_tokens: int = 64, frames_per_chunk: int = 2) -> EngineLimits:
    return EngineLimits(max_batch=max_batch, max_prefill_tokens=max_prefill_tokens,
                        max_prefill_seqs=min(4, max_batch), max_codec_batch=max_codec_batch,
                        frames_per_chunk=frames_per_chunk, num_pages=num_pages + 1, page_size=page_size,
                        max_model_len=META.max_model_len)


class Bench:
    """A scheduler and a simulated worker on one virtual clock, stepped by hand."""

    def __init__(self, policy: str = "base", meta: ProgramMeta = META, lim: EngineLimits | None = None,
                 **config: object) -> None:
        self.clock = VirtualClock()
        self.limits = lim or limits()
        cfg = SchedulerConfig(scheduler_type=policy, max_batch_size=self.limits.max_batch,
                              max_codec_batch=self.limits.max_codec_batch, **config)
        self.scheduler: Scheduler = make_scheduler(meta, self.limits, cfg, self.clock)
        self.worker = SimWorker(meta, self.limits, COSTS, self.clock)
        self.chunks: dict[str, list[tuple[float, int]]] = {}

    def add(self, req_id: str, frames: int, prompt_len: int = 6, streaming: bool = True, **sampling: object) -> Request:
        params = SamplingParams(temperature=0.0, max_tokens=sampling.pop("max_tokens", frames * 2 + 2), **sampling)
        req = Request(req_id, Prompt.of([[1]] * prompt_len), params, streaming=streaming)
        self.chunks[req_id] = []
        req.sink = lambda r, pcm, final: pcm and self.chunks[r.req_id].append((self.clock(), len(pcm) // 2))
        self.worker.set_length(req_id, frames)
        self.scheduler.add_request(req)
        return req

    def step(self) -> StepPlan:
        plan = self.scheduler.schedule()
        if not plan.is_empty:
            self.scheduler.update(plan, self.worker.execute(plan))
        return plan

    def run(self, max_steps: int = 10_000, until=None) -> None:  # noqa: ANN001
        """Step (advancing the virtual clock over idle waits) until no work is left, or `until()` holds."""
        for _ in range(max_steps):
            if not self.scheduler.has_work() if until is None else until():
                return
            if self.step().is_empty:
                wake = self.scheduler.next_wakeup()
                assert wake is not None, "nothing to run and nothing to wait for"
                self.clock.advance_to(wake)
        raise AssertionError("did not finish")


def expected_samples(num_frames: int, meta: ProgramMeta = META) -> int:
    """Audio of a request that generated num_frames frames: every frame with its full window."""
    emitted = max(num_frames - meta.codec_lookahead_frames - meta.skip_leading_frames, 0)
    return emitted * meta.samples_per_frame


def finished(req: Request) -> bool:
    return req.status is RequestStatus.FINISHED

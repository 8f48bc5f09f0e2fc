"""The worker of a disaggregated engine: two engine workers, one per half, and the hand-over between them.

A step plan is split (`split_plan`): the LM half gets the admissions (without codec prefixes), the page
updates, the codec rows (whose windows it gathers) and the LM rows; the codec half gets the admissions
(with their prefixes) and the codec rows. Launch order, per step:

  LM stream:    upload, prologue, [wait: the last hand-over copy done], gathers, record `gathered`,
                ..., prefill, decode, download
  codec stream: upload, prologue, codec_prime, [wait `gathered`], copy the hand-over arena LM -> codec,
                record `copied`, codec_first, codec, download

The codec half is queued before the LM half's prefill and decode, so on two GPUs the codec's work of
step k overlaps the LM's. On a CPU the same calls run in that order and the copy is an explicit copy
between the two halves' arenas. The result joins the LM half's out kinds and the codec half's PCM; the codec
half is collected first, its PCM handed over before the LM half ends (`early_pcm`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from vox_serve.core.meta import CODEC_PREFIX
from vox_serve.core.plan import StepPlan, StepResult
from vox_serve.core.stages import CODEC_WINDOW_STAGES, EngineHalf, Stage
from vox_serve.rt.device import device_scope
from vox_serve.worker.engine_worker import EngineWorker, StepHandle

log = logging.getLogger(__name__)


def split_plan(plan: StepPlan) -> tuple[StepPlan, StepPlan]:
    """(the LM half's plan, the codec half's plan) of one step."""
    lm_admits = [dataclasses.replace(a, conditioning={k: v for k, v in a.conditioning.items() if k != CODEC_PREFIX})
                 for a in plan.admits]
    lm = StepPlan(plan.step_id, admits=lm_admits, pages=plan.pages, codec=plan.codec, prefill=plan.prefill,
                  decode=plan.decode)
    return lm, StepPlan(plan.step_id, admits=list(plan.admits), codec=plan.codec)


def _bytes_at(ptr: int, nbytes: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


class Handover:
    """The per-step copy of the codec rows' inputs, from the LM half's hand-over arena to the codec half's
    (the same layout on both devices): one copy of the bytes up to the last field the step's codec stages
    use."""

    def __init__(self, lm: EngineWorker, codec: EngineWorker) -> None:
        self.lm, self.codec = lm, codec
        src, dst = lm.spec["handover"], codec.spec["handover"]
        if src is None or dst is None or src["fields"] != dst["fields"]:
            raise ValueError("the two halves' hand-over arenas differ; the engine was not split by engine/disagg.py")
        self.src_ptr, self.dst_ptr = src["device_ptr"], dst["device_ptr"]
        self.ends: dict[str, int] = {}  # codec stage -> the end of its last hand-over field
        for f in src["fields"]:
            stage = f["name"].rsplit("_", 1)[0]
            self.ends[stage] = max(self.ends.get(stage, 0), f["offset"] + f["nbytes"])
        self.cuda = lm.cuda
        if self.cuda is not None:
            self._setup_cuda(lm.spec["device"], codec.spec["device"])

    def _setup_cuda(self, lm_device: str, codec_device: str) -> None:
        import torch

        self.src_device = torch.device(lm_device).index or 0
        self.dst_device = torch.device(codec_device).index or 0
        with device_scope(codec_device):
            if not self.cuda.enable_peer_access(self.dst_device, self.src_device):
                log.warning("cuda:%d cannot read cuda:%d directly: the driver stages the hand-over copy",
                            self.dst_device, self.src_device)
            self.copied = self.cuda.event(timing=False)
        with device_scope(lm_device):
            self.gathered = self.cuda.event(timing=False)

    def nbytes(self, launches: list[Any]) -> int:
        return max((self.ends[str(x.stage)] for x in launches if x.stage in CODEC_WINDOW_STAGES), default=0)

    def before_gather(self) -> None:
        """The LM half's gathers overwrite its arena only once the previous step's copy has read it."""
        if self.cuda is not None:
            self.cuda.wait_event(self.lm.stream, self.copied)

    def gathered_all(self) -> None:
        if self.cuda is not None:
            self.cuda.record(self.gathered, self.lm.stream)

    def copy(self, nbytes: int) -> None:
        """On the codec half's stream, after the gathers: LM arena -> codec arena."""
        if self.cuda is None:
            _bytes_at(self.dst_ptr, nbytes)[:] = _bytes_at(self.src_ptr, nbytes)
            return
        self.cuda.wait_event(self.codec.stream, self.gathered)
        self.cuda.copy_peer(self.dst_ptr, self.dst_device, self.src_ptr, self.src_device, nbytes, self.codec.stream)
        self.cuda.record(self.copied, self.codec.stream)


@dataclass
class DisaggregatedHandle:
    plan: StepPlan
    lm: StepHandle
    codec: StepHandle
    codec_result: StepResult | None = None  # the codec half, collected early (`early_pcm`), its PCM handed over


class DisaggregatedWorker:
    """`launch(plan)` / `collect(handle)` over the two halves of a disaggregated engine's spec."""

    def __init__(self, spec: dict[str, Any], time_stages: bool = False, nvtx: bool = False) -> None:
        self.lm = self._half(spec["lm"], EngineHalf.LM, time_stages, nvtx)
        self.codec = self._half(spec["codec"], EngineHalf.CODEC, time_stages, nvtx)
        self.meta, self.limits, self.timer = self.lm.meta, self.lm.limits, self.lm.timer
        self.handover = Handover(self.lm, self.codec)

    @staticmethod
    def _half(spec: dict[str, Any], half: EngineHalf, time_stages: bool, nvtx: bool) -> EngineWorker:
        if spec.get("half") != str(half):
            raise ValueError(f"expected the spec of a disaggregated engine's {half} half, got {spec.get('half')!r}")
        with device_scope(spec["device"]):
            return EngineWorker(spec, time_stages=time_stages, nvtx=nvtx)

    def execute(self, plan: StepPlan) -> StepResult:
        return self.collect(self.launch(plan))

    def launch(self, plan: StepPlan) -> DisaggregatedHandle:
        lm_plan, codec_plan = split_plan(plan)
        with device_scope(self.lm.spec["device"]):
            lm = self.lm.begin(lm_plan)
            lm_stages = [x.stage for x in lm.launches]  # the prologue and the gathers come first
            num_head = next((i for i, s in enumerate(lm_stages) if s in (Stage.PREFILL, Stage.DECODE)), len(lm_stages))
            if any(s in CODEC_WINDOW_STAGES for s in lm_stages):
                self.handover.before_gather()
            for launch in lm.launches[:num_head]:
                self.lm.run(launch, lm)
            self.handover.gathered_all()
        nbytes = self.handover.nbytes(lm.launches)
        with device_scope(self.codec.spec["device"]):
            codec = self.codec.begin(codec_plan)
            for launch in codec.launches:
                if launch.stage in CODEC_WINDOW_STAGES and nbytes:
                    self.handover.copy(nbytes)
                    nbytes = 0
                self.codec.run(launch, codec)
            self.codec.finish(codec)
        with device_scope(self.lm.spec["device"]):
            for launch in lm.launches[num_head:]:
                self.lm.run(launch, lm)
            self.lm.finish(lm)
        return DisaggregatedHandle(plan, lm, codec)

    def early_pcm(self, handle: DisaggregatedHandle) -> list[bytes | memoryview] | None:
        """The codec half collected as soon as it is done, its PCM handed over while the LM half still runs
        (None: no codec rows, or `VOX_EARLY_PCM=0`). A failed codec half fails its rows' requests only."""
        if not self.lm.early or not len(handle.plan.codec) or handle.codec_result is not None:
            return None
        handle.codec_result = StepResult(handle.plan.step_id, pcm_early=True)
        with device_scope(self.codec.spec["device"]):
            codec = self.codec.collect(handle.codec)
        handle.codec_result = dataclasses.replace(codec, pcm=[], pcm_early=True)
        return codec.pcm

    def collect(self, handle: DisaggregatedHandle) -> StepResult:
        lm = self.lm.collect(handle.lm)
        codec = handle.codec_result or self.codec.collect(handle.codec)
        seconds = {("handover" if s in CODEC_WINDOW_STAGES else s): t for s, t in lm.stage_seconds.items()}
        seconds.update({("codec_prologue" if s == Stage.PROLOGUE else s): t for s, t in codec.stage_seconds.items()})
        return StepResult(handle.plan.step_id, prefill_kind=lm.prefill_kind, decode_kind=lm.decode_kind,
                          pcm=codec.pcm, stage_seconds=seconds, pcm_early=codec.pcm_early)

    def read_outputs(self, slot: int, num_tokens: int, num_codes: int) -> tuple[list[list[int]], list[int]]:
        """The slot's tokens and codes, from the LM half (which makes them)."""
        with device_scope(self.lm.spec["device"]):
            return self.lm.read_outputs(slot, num_tokens, num_codes)


def make_worker(spec: dict[str, Any], time_stages: bool = False, nvtx: bool = False) -> Any:
    """The worker that drives `spec`: a disaggregated engine's pair of halves, or one engine."""
    if spec.get("disaggregated"):
        return DisaggregatedWorker(spec, time_stages=time_stages, nvtx=nvtx)
    return EngineWorker(spec, time_stages=time_stages, nvtx=nvtx)

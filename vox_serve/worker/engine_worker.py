"""The worker: step plans in, step results out, driving an engine through its spec alone.

It knows nothing of the program but what the spec says: the step arenas by address and layout,
the launches by handle (a graph-exec handle launched with cudaGraphLaunch, or a callable handle
where nothing is captured: every stage on a CPU, prefill with an eager attention backend), and
the attention planner by handle. Per step: write the plan into the current pinned host buffer
(`rt/step_writer.py`), one host-to-device copy, plan and launch each stage, one device-to-host
copy of the outputs. `launch(plan)` returns at once on a GPU; `collect(handle)` waits for the step
and reads its outputs (`execute` does both). The PCM of a step's codec rows is copied back right after
their launches, with an event behind it, so `early_pcm(handle)` hands it over while the step's LM launches
still run (`VOX_EARLY_PCM=0`: with the other outputs, an A/B switch). Host buffers alternate between steps, so with
asynchronous scheduling step k+1 is written while step k runs.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.plan import StepPlan, StepResult
from vox_serve.core.stages import Stage
from vox_serve.engine.registry import resolve_planner, resolve_stage
from vox_serve.rt.device import device_scope
from vox_serve.rt.nvtx import nvtx_range
from vox_serve.rt.step_writer import HostViews, Launch, StepReader, StepWriter
from vox_serve.worker.host_memory import keep_freed_buffers

_DTYPES = {"int16": np.int16, "int32": np.int32, "int64": np.int64, "float32": np.float32, "bool": np.bool_,
           "uint8": np.uint8}


def host_views(layout: dict[str, Any], ptr: int) -> HostViews:
    """numpy views of an arena's fields in the buffer at `ptr` (host memory)."""
    buf = np.ctypeslib.as_array((ctypes.c_uint8 * layout["nbytes"]).from_address(ptr))
    return {f["name"]: buf[f["offset"]: f["offset"] + f["nbytes"]].view(_DTYPES[f["dtype"]]).reshape(f["shape"])
            for f in layout["fields"]}


def limits_from_spec(data: dict[str, Any]) -> EngineLimits:
    names = {f.name for f in fields(EngineLimits)}
    return EngineLimits(**{k: v for k, v in data.items() if k in names})


@dataclass
class StepHandle:
    plan: StepPlan
    launches: list[Launch]
    parity: int
    result: StepResult | None = None  # read at launch when the device is the host (CPU)
    seconds: dict[str, float] = field(default_factory=dict)
    pcm_early: bool = False  # the PCM of the codec rows was copied back right after their launches
    pcm_taken: bool = False  # ... and handed over by `early_pcm`


class EngineWorker:
    def __init__(self, spec: dict[str, Any], time_stages: bool = False, nvtx: bool = False) -> None:
        self.spec = spec
        self.nvtx = nvtx and spec["device"].startswith("cuda")
        self.meta, self.limits = ProgramMeta.from_dict(spec["meta"]), limits_from_spec(spec["limits"])
        self.on_cuda = spec["device"].startswith("cuda")
        self.timer = "cuda" if self.on_cuda else "wall"
        self.time_stages = time_stages
        arenas = spec["arenas"]
        self._in, self._out = arenas["step_in"], arenas["step_out"]
        self.h_in = [host_views(self._in, p) for p in self._in["host_ptrs"]]
        self.h_out = [host_views(self._out, p) for p in self._out["host_ptrs"]]
        stages = spec["stages"]
        self.buckets = {Stage(s): v["buckets"] for s, v in stages.items()}
        self.launchers = self._launchers(stages)
        offsets_in = {f["name"]: f["offset"] + f["nbytes"] for f in self._in["fields"]}
        captured_prefill = stages.get("prefill", {}).get("captured_seqs") is not None  # a codec half has none
        self.writer = StepWriter(self.meta, self.limits, self.buckets, captured_prefill, offsets_in.__getitem__)
        self.reader = StepReader(self.meta, self.limits, {f["name"]: f["offset"] for f in self._out["fields"]})
        self.plan_attention = resolve_planner(spec["attention"]["planner"])
        self.tables = spec["slot_state"]["tables"]
        self._steps = 0
        self.early = early_pcm_enabled()
        self.cuda = None
        keep_freed_buffers()  # each step's audio is a fresh copy (StepReader.read)
        if self.on_cuda:
            self._setup_cuda()

    def _launchers(self, stages: dict[str, Any]) -> dict[tuple[Stage, int], Any]:
        out: dict[tuple[Stage, int], Any] = {}
        for name, entry in stages.items():
            for bucket, graph in entry["graphs"].items():
                out[(Stage(name), int(bucket))] = int(graph["exec"])
            for bucket, handle in entry["callables"].items():
                out[(Stage(name), int(bucket))] = resolve_stage(handle)
        return out

    def _setup_cuda(self) -> None:
        import torch

        from vox_serve.worker.cuda_runtime import CudaRuntime

        self.cuda = CudaRuntime()
        device = torch.device(self.spec["device"])
        self._torch_stream = torch.cuda.Stream(device)
        torch.cuda.set_stream(self._torch_stream)  # FlashInfer's planners and eager stages run on it too
        self.stream = self._torch_stream.cuda_stream
        with device_scope(device):  # events belong to the engine's device (a codec half's is not the first)
            self._done = [self.cuda.event(timing=False) for _ in self.h_in]
            self._early = [self.cuda.event(timing=False) for _ in self.h_in]
            self._events = {(p, s, edge): self.cuda.event(timing=True) for p in range(len(self.h_in))
                            for s in Stage for edge in (0, 1)}

    # ---- a step ------------------------------------------------------------------------------
    def execute(self, plan: StepPlan) -> StepResult:
        return self.collect(self.launch(plan))

    def launch(self, plan: StepPlan) -> StepHandle:
        handle = self.begin(plan)
        last_codec = max((i for i, launch in enumerate(handle.launches) if launch.rows is not None), default=-1)
        for i, launch in enumerate(handle.launches):
            self.run(launch, handle)
            if i == last_codec and self.early:
                self._copy_pcm_early(handle)
        self.finish(handle)
        return handle

    def _copy_pcm_early(self, handle: StepHandle) -> None:
        """The PCM of the step's codec rows back to the host before its LM launches, an event behind it."""
        handle.pcm_early = True
        if self.cuda is None:  # read with the rest of the outputs once the step's calls have returned
            return
        start, end = self.reader.pcm_bytes(handle.launches)
        host, device = self._out["host_ptrs"][handle.parity], self._out["device_ptr"]
        self.cuda.copy(host + start, device + start, end - start, 2, self.stream)
        self.cuda.record(self._early[handle.parity], self.stream)

    def early_pcm(self, handle: StepHandle) -> list[bytes | memoryview] | None:
        """The PCM of a step's codec rows once copied back (`_copy_pcm_early`), before the step ends; None where
        it comes with the step's result. The step's result then carries none (`StepResult.pcm_early`)."""
        if not handle.pcm_early or handle.pcm_taken:
            return None
        handle.pcm_taken = True
        if handle.result is not None:  # the host device: read at launch
            pcm, handle.result.pcm, handle.result.pcm_early = handle.result.pcm, [], True
            return pcm
        self.cuda.synchronize(self._early[handle.parity])
        return self.reader.read_pcm(self.h_out[handle.parity], handle.plan, handle.launches)

    # The parts of `launch`, for a runtime that interleaves two engines' steps (worker/disagg_worker.py).
    def begin(self, plan: StepPlan) -> StepHandle:
        """Write the plan into the next host buffer and upload it; the handle lists the step's launches."""
        parity = self._steps % len(self.h_in)
        self._steps += 1
        launches, nbytes = self.writer.write(self.h_in[parity], plan)
        handle = StepHandle(plan, launches, parity)
        if self.cuda is not None:
            self.cuda.copy(self._in["device_ptr"], self._in["host_ptrs"][parity], nbytes, 1, self.stream)
        return handle

    def finish(self, handle: StepHandle) -> None:
        """After the step's launches: download its outputs (read them at once on a CPU)."""
        if self.cuda is None:
            handle.result = self.reader.read(self.h_out[0], handle.plan, handle.launches)
            return
        down = self.reader.kinds_end if handle.pcm_early else self.reader.download_bytes(handle.launches)
        self.cuda.copy(self._out["host_ptrs"][handle.parity], self._out["device_ptr"], down, 2, self.stream)
        self.cuda.record(self._done[handle.parity], self.stream)

    def run(self, launch: Launch, handle: StepHandle) -> None:
        """One launch of the step: plan its attention (LM stages), then launch its graph or callable."""
        stage = launch.stage
        if launch.attention is not None:
            self.plan_attention(stage, launch.attention, handle.parity)
        run = self.launchers[(stage, launch.bucket)]
        timed = self.time_stages and self.cuda is not None
        if timed:
            self.cuda.record(self._events[(handle.parity, stage, 0)], self.stream)
        start = time.perf_counter()
        if self.nvtx:
            with nvtx_range(f"{stage}[{launch.bucket}]", True):
                self._invoke(run, launch)
        else:
            self._invoke(run, launch)
        if timed:
            self.cuda.record(self._events[(handle.parity, stage, 1)], self.stream)
        elif self.cuda is None:
            handle.seconds[str(stage)] = time.perf_counter() - start

    def _invoke(self, run: int | Any, launch: Launch) -> None:
        """Launch a graph-exec handle on the engine's stream, or call a callable handle."""
        if isinstance(run, int):
            self.cuda.launch(run, self.stream)
        else:
            run(launch.num_seqs)

    def collect(self, handle: StepHandle) -> StepResult:
        if handle.result is None:
            self.cuda.synchronize(self._done[handle.parity])
            h = self.h_out[handle.parity]
            handle.result = self.reader.read(h, handle.plan, handle.launches, with_pcm=not handle.pcm_taken)
            if self.time_stages:
                e = self._events
                handle.seconds = {str(x.stage): self.cuda.elapsed_ms(e[(handle.parity, x.stage, 0)],
                                                                     e[(handle.parity, x.stage, 1)]) / 1000
                                  for x in handle.launches}
        handle.result.stage_seconds = handle.seconds
        return handle.result

    # ---- outputs for recording (tests, debugging) ----------------------------------------------
    def read_outputs(self, slot: int, num_tokens: int, num_codes: int) -> tuple[list[list[int]], list[int]]:
        """The slot's first `num_tokens` token rows and `num_codes` codes, copied from the device."""
        tokens = self._read_table("tokens")[slot, :num_tokens]
        codes = self._read_table("codes")[slot, :num_codes]
        return tokens.tolist(), codes.tolist()

    def _read_table(self, name: str) -> np.ndarray:
        t = self.tables[name]
        if self.cuda is None:
            buf = np.ctypeslib.as_array((ctypes.c_uint8 * t["nbytes"]).from_address(t["ptr"]))
            return buf.view(_DTYPES[t["dtype"]]).reshape(t["shape"])
        out = np.empty(t["shape"], dtype=_DTYPES[t["dtype"]])
        self.cuda.copy(out.ctypes.data, t["ptr"], t["nbytes"], 2, self.stream)
        self.cuda.stream_synchronize(self.stream)
        return out


def early_pcm_enabled() -> bool:
    """`VOX_EARLY_PCM`: 1 (the default) hands each step's PCM over as soon as it is decoded, 0 with the step."""
    value = os.environ.get("VOX_EARLY_PCM", "1")
    if value not in ("0", "1"):
        raise ValueError(f"VOX_EARLY_PCM={value!r}: expected 1 (the default) or 0")
    return value == "1"

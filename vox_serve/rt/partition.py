"""SM partitions of a GPU (`--codec-sms N`): a CUDA green context of N SMs and the streams that run on it.

Kernels go to the SMs of the context their stream belongs to, and a captured graph's kernels to the
context of the stream it was captured on, so a codec half on a partition captures its graphs on the
partition's stream (`engine/capture.py`) and is launched on it (`rust_host.launch_stream`). One partition
per (GPU, size) per process: with `--codec-gpu G --codec-sms N` the codec halves of all replicas share
it, and take turns on it through the Rust runtime's codec lane. The LM halves keep the whole GPU.

Sizes follow the driver's granularity (`granted_sms`): on compute capability 9.0 and later a partition
is a multiple of 8 SMs, at least 8 (CUDA driver API, green contexts); 8.x: multiples of 2, at least 4.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


class PartitionError(ValueError):
    """An SM partition this GPU or this PyTorch cannot make; the message says why."""


@dataclasses.dataclass(frozen=True)
class SmGranularity:
    minimum: int
    multiple: int


def granularity(cc_major: int) -> SmGranularity:
    """The smallest partition and its step for a compute capability (the driver documents these)."""
    if cc_major >= 9:
        return SmGranularity(minimum=8, multiple=8)
    if cc_major == 8:
        return SmGranularity(minimum=4, multiple=2)
    raise PartitionError(f"SM partitions (green contexts) need compute capability 8.0 or later, not {cc_major}.x")


def granted_sms(requested: int, total: int, cc_major: int) -> int:
    """The SMs the driver gives a request of `requested` (rounded up to the granularity), checked
    against the `total` SMs of the GPU."""
    if requested < 1:
        raise PartitionError(f"--codec-sms {requested}: a partition has at least one SM")
    step = granularity(cc_major)
    sms = max(step.minimum, -(-requested // step.multiple) * step.multiple)
    if sms > total:
        largest = total // step.multiple * step.multiple
        raise PartitionError(f"--codec-sms {requested}: a partition of {sms} SMs does not fit in the {total} SMs "
                             f"of this GPU (the largest is {largest})")
    return sms


@dataclasses.dataclass
class SmPartition:
    device: torch.device
    sms: int
    context: Any  # torch.cuda.green_contexts.GreenContext, kept alive with the partition
    stream: torch.cuda.Stream  # the partition's stream: graphs are captured and launched on it

    def describe(self) -> str:
        total = torch.cuda.get_device_properties(self.device).multi_processor_count
        return f"SM partition of {self.sms} of the {total} SMs of {self.device} (green context)"


_PARTITIONS: dict[tuple[int, int], SmPartition] = {}


def sm_partition(device: str | torch.device, requested: int) -> SmPartition:
    """The process's partition of `requested` SMs (rounded up, `granted_sms`) on a CUDA device, made once."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise PartitionError(f"--codec-sms partitions a GPU's SMs; the codec runs on {dev}")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    sms = granted_sms(requested, props.multi_processor_count, props.major)
    key = (index, sms)
    if key not in _PARTITIONS:
        context = _green_context(index, sms)
        _PARTITIONS[key] = SmPartition(device=torch.device("cuda", index), sms=sms, context=context,
                                       stream=_stream_of(context, index))
    return _PARTITIONS[key]


def partition_stream(handle: int) -> torch.cuda.Stream | None:
    """The partition stream whose raw handle is `handle`, if it is one."""
    return next((p.stream for p in _PARTITIONS.values() if p.stream.cuda_stream == handle), None)


def _green_context(index: int, sms: int) -> Any:
    from torch.cuda import green_contexts

    if not getattr(green_contexts, "SUPPORTED", hasattr(torch._C, "_CUDAGreenContext")):
        raise PartitionError("--codec-sms needs PyTorch built with CUDA green contexts (CUDA 12.8 or later); "
                             f"this torch {torch.__version__} has none")
    torch.cuda.init()
    with torch.cuda.device(index):
        try:
            return green_contexts.GreenContext.create(num_sms=sms, device_id=index)
        except RuntimeError as exc:
            raise PartitionError(f"--codec-sms {sms}: the CUDA driver refused a green context on cuda:{index}: "
                                 f"{exc}") from exc


def _stream_of(context: Any, index: int) -> torch.cuda.Stream:
    """The green context's stream (`GreenContext.Stream()`, torch 2.11 and later)."""
    if not hasattr(context, "Stream"):
        raise PartitionError(f"--codec-sms needs a torch whose green contexts have streams (2.11 or later), not "
                             f"{torch.__version__}")
    stream = context.Stream()
    if not isinstance(stream, torch.cuda.Stream):
        stream = torch.cuda.ExternalStream(int(stream), device=torch.device("cuda", index))
    return stream

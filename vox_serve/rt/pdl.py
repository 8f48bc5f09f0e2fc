"""Programmatic dependent launch (PDL) for the Triton kernels of a step, on Hopper and newer GPUs.

A decode step is hundreds of small kernels in a row, each waiting for the one before it to finish before it is
even scheduled: at batch 1 each boundary costs ~1-3 us of idle SMs (the launch, the first loads' latency). A
kernel launched with PDL (the launch attribute "programmatic stream serialization") is scheduled while the kernel
before it on the stream is still running, and its programs stop at `enter()` until that kernel has completed and
its writes are visible (PTX griddepcontrol.wait); past that point they signal that the kernel after them may be
scheduled in turn (griddepcontrol.launch_dependents). So the launch of each kernel overlaps the tail of the one
before, and never more than one kernel waits ahead. CUDA graphs keep these edges when they capture the stream.

The contract for a kernel taking part: `PDL: tl.constexpr` among its parameters, `pdl.enter(PDL)` before its
first load or store, and `**pdl.launch_options(t)` in its launch. Kernels from elsewhere (cuBLAS, FlashInfer,
PyTorch) need nothing: a kernel after them waits for their completion as before.

Prefetching a projection's weights into L2 before the wait (PTX prefetch.global.L2, by the waiting programs) was
measured and dropped: on an H200 (benchmark/results/h200-2026-12-03d) whole weight slices with evict_last took the
Qwen3-TTS frame at 1 row from 3.690 to 3.947 ms and Orpheus' step from 2.181 to 2.245 ms, and only the first
pipeline stages' lines 3.679 -> 3.958 and 2.085 -> 2.170 ms.

`VOX_PDL`: auto (the default: on where it applies, a CUDA device of compute capability >= 9.0 and a Triton
with griddepcontrol), 0 (off, for A/B measurements) or 1 (on; refused where it does not apply). Measured on an
H200 (benchmark/results/h200-2026-12-03c): the captured decode step of Orpheus-3B at 1 row 2.488 -> 2.324 ms,
the Qwen3-TTS-1.7B frame 4.078 -> 3.794 ms; at 16 rows 3.110 -> 3.023 and 5.974 -> 5.938 ms.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except Exception:  # noqa: BLE001 - no Triton, or one without griddepcontrol: launches stay plain
    triton = None

ENV = "VOX_PDL"
MIN_CAPABILITY = (9, 0)


def _setting() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in ("0", "1", "auto"):
        raise ValueError(f"{ENV}={value!r}: use 0 (off), 1 (on; refused where unsupported) or auto")
    return value


@functools.cache
def _device_supports(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= MIN_CAPABILITY


def enabled(t: Tensor) -> bool:
    """Whether Triton launches on t's device use PDL (see the module docstring)."""
    setting = _setting()
    if setting == "0" or not t.is_cuda:
        return False
    supported = triton is not None and _device_supports(t.device.index or 0)
    if setting == "1" and not supported:
        raise RuntimeError(f"{ENV}=1: programmatic dependent launch needs compute capability "
                           f">= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} and a Triton with griddepcontrol")
    return supported


def launch_options(t: Tensor) -> dict[str, bool]:
    """The keyword arguments for a participating kernel's launch on t's device: its PDL constexpr and, when on,
    Triton's launch_pdl option."""
    return {"PDL": True, "launch_pdl": True} if enabled(t) else {"PDL": False}


if triton is not None:

    @triton.jit
    def enter(PDL: tl.constexpr):
        """A participating kernel's first statement: wait for the kernel before it, then let the next one launch."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

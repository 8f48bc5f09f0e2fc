"""Which CUDA device is current while a half of a disaggregated engine is built or driven.

CUDA graphs, their memory pools and events belong to the device that is current when they are made, and
a kernel goes to the current device's streams; an engine on `cuda:1` is built and driven with that device
current. On a CPU (or for the current device) the scope changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def device_scope(device: str | torch.device) -> Iterator[None]:
    dev = torch.device(device)
    if dev.type != "cuda" or dev.index is None:
        yield
        return
    with torch.cuda.device(dev):
        yield

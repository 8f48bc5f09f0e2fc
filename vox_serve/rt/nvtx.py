"""NVTX ranges for `--enable-nvtx`: named spans in Nsight Systems timelines (no-ops when off)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def nvtx_range(name: str, enabled: bool) -> Iterator[None]:
    """A range named `name` around the block when enabled (CUDA builds of torch only)."""
    if not enabled:
        yield
        return
    import torch

    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()

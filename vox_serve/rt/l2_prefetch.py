"""Weights brought into the L2 cache while a few-row decoder layer's attention leaves the memory idle (Hopper).

At a few rows a decoder layer is bound by reading its projections' weights from HBM (Orpheus-3B at 1 row: ~1.6 of
its 2.1 ms step on an H200), but between the qkv projection and the output projection it runs the rope and KV
write and the attention, which read a few MB in ~10-15 us: the memory idles there. `issue` queues, on a side
stream forked at that point, asynchronous bulk prefetches into L2 (PTX `cp.async.bulk.prefetch.L2`, sm_90) of the
weights that come next: the output projection's whole, then the same leading bytes of every row of the gate/up
projection (so every program of that projection finds the same share of its rows in L2), within `BUDGET_SHARE` of
the L2. `join` makes the current stream wait for the side stream before the output projection; the kernel only
issues the prefetches (the lines arrive after it ends), so it finishes long before the attention does.

Prefetches are hints: they change no value, only where the projections' loads find their bytes. Prefetching inside
the projections' own kernels, ahead of their PDL wait, was measured slower (rt/pdl.py): there the bytes competed with
the projection before them for the same memory; here they fill time the memory would idle.

`VOX_L2_PREFETCH`: 0 (off) or 1 (on where it applies: CUDA tensors of at most `MAX_ROWS` rows on a GPU of compute
capability >= 9.0 with Triton); unset: the default, `DEFAULT_ON`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton: nothing is prefetched
    triton = None

ENV = "VOX_L2_PREFETCH"
DEFAULT_ON = False
MAX_ROWS = 16  # rows (tokens) of a step up to which the attention leaves the memory idle enough
BUDGET_SHARE = 0.5  # of the L2 that one layer's prefetches may fill
LINE = 128  # bytes: the L2 line; a row's share is a multiple of it
CHUNK = 4096  # bytes per prefetch instruction (at most; a row's share may be less)
BLOCK = 128  # prefetch instructions per program
MIN_CAPABILITY = (9, 0)


@dataclass(frozen=True)
class Region:
    """`rows` runs of `row_bytes` bytes, `stride` bytes apart, from the device address `base`."""

    base: int
    rows: int
    stride: int
    row_bytes: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def chunks_per_row(self) -> int:
        return -(-self.row_bytes // CHUNK)

    @property
    def chunks(self) -> int:
        return self.rows * self.chunks_per_row


def whole(t: Tensor) -> Region:
    """All of a contiguous tensor's bytes."""
    if not t.is_contiguous():
        raise ValueError("l2_prefetch.whole: the tensor must be contiguous")
    return Region(base=t.data_ptr(), rows=1, stride=0, row_bytes=_lines(t.numel() * t.element_size()))


def leading(t: Tensor, row_bytes: int) -> Region:
    """The first `row_bytes` bytes (rounded down to whole lines, at most the row) of every row of a contiguous
    2-D tensor."""
    if t.dim() != 2 or not t.is_contiguous():
        raise ValueError("l2_prefetch.leading: the tensor must be 2-D and contiguous")
    row = t.shape[1] * t.element_size()
    share = min(row_bytes // LINE * LINE, row)
    return Region(base=t.data_ptr(), rows=t.shape[0], stride=row, row_bytes=share)


def _lines(nbytes: int) -> int:
    """nbytes rounded up to a multiple of 16, as the bulk prefetch needs (allocations are aligned far past that)."""
    return -(-nbytes // 16) * 16


def plan(first: Tensor, then: Tensor, budget: int) -> list[Region]:
    """`first` whole (where it fits the budget), then the leading bytes of every row of `then` with what is left."""
    regions = []
    head = whole(first)
    if head.nbytes <= budget:
        regions.append(head)
        budget -= head.nbytes
    rows = then.shape[0]
    tail = leading(then, budget // rows) if rows else None
    if tail is not None and tail.row_bytes > 0:
        regions.append(tail)
    return regions


_setting_cache: dict[str, str] = {}


def _setting() -> str:
    if ENV not in _setting_cache:
        value = os.environ.get(ENV, "")
        if value not in ("", "0", "1"):
            raise ValueError(f"{ENV}={value!r}: use 0 (off) or 1 (on; unset: the default)")
        _setting_cache[ENV] = value
    return _setting_cache[ENV]


@functools.cache
def _device(index: int) -> tuple[bool, int]:
    """(whether the device has the bulk prefetch, its L2 bytes)."""
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor) >= MIN_CAPABILITY, int(props.L2_cache_size)


def budget(t: Tensor) -> int:
    """The bytes one layer may prefetch on t's device (0 where nothing is prefetched for t)."""
    value = _setting()
    on = value == "1" or (value == "" and DEFAULT_ON)
    if not (on and triton is not None and t.is_cuda and 0 < t.shape[0] <= MAX_ROWS):
        return 0
    supported, l2_bytes = _device(t.device.index or 0)
    return int(l2_bytes * BUDGET_SHARE) if supported else 0


@functools.cache
def _side_stream(index: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(device=index)


def issue(anchor: Tensor, regions: list[Region]) -> torch.cuda.Stream | None:
    """Prefetch `regions` on a side stream that starts after what is queued on anchor's stream so far; the stream
    to `join`, or None when there is nothing to prefetch."""
    if not regions:
        return None
    current = torch.cuda.current_stream(anchor.device)
    side = _side_stream(anchor.device.index or 0)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for region in regions:
            launch(region, anchor)
    return side


def join(side: torch.cuda.Stream | None, anchor: Tensor) -> None:
    """The current stream waits for the side stream of `issue` (nothing when it returned None)."""
    if side is not None:
        torch.cuda.current_stream(anchor.device).wait_stream(side)


def launch(region: Region, anchor: Tensor, dry_run: Tensor | None = None) -> None:
    """One region's prefetch kernel on the current stream. With `dry_run` ([chunks, 2] int64, any device; on CPU
    through Triton's interpreter) nothing is prefetched: each instruction's byte offset from the base and size are
    written there instead."""
    grid = (triton.cdiv(region.chunks, BLOCK),)
    out = dry_run if dry_run is not None else anchor
    _prefetch_kernel[grid](out, region.base, region.rows, region.stride, region.row_bytes, region.chunks_per_row,
                           CHUNK=CHUNK, BLOCK=BLOCK, DRY=dry_run is not None, num_warps=4)


if triton is not None:

    @triton.jit(do_not_specialize=["base", "rows", "stride", "row_bytes", "chunks_per_row"])
    def _prefetch_kernel(out_ptr, base, rows, stride, row_bytes, chunks_per_row, CHUNK: tl.constexpr,
                         BLOCK: tl.constexpr, DRY: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        row = i // chunks_per_row
        start = (i % chunks_per_row) * CHUNK
        live = row < rows
        offset = tl.where(live, row.to(tl.int64) * stride + start, 0)
        size = tl.where(live, tl.minimum(row_bytes - start, CHUNK), 16)  # past the end: the first line again
        if DRY:
            tl.store(out_ptr + 2 * i, offset, mask=live)
            tl.store(out_ptr + 2 * i + 1, size.to(tl.int64), mask=live)
        else:
            tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                                      [base + offset, size.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)

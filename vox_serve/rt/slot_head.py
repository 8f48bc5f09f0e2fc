"""Logits of a few rows over each row's own window of the vocabulary (an LM head restricted per row), in one
Triton kernel that reads each needed weight row once.

A model whose next token is constrained to a window that depends on the row (Orpheus: the audio ids are 7 slots
of 4096, and a row at slot s may only emit slot s's ids or the stop id) needs, per row m, the dot products of
its hidden state with weight rows `base + width * slot[m] + c` (c < width) and with one extra row (`extra_id`).
In PyTorch that is a GEMM over all `num_slots * width` rows, a gather of the row's window, a second product for
the extra column, a cast and a cat: ~6 kernels, and `num_slots` times the weight bytes the rows need (Orpheus
3B: 176 MB read where 25 MB are used, ~40 us per decode step on an H200).

`slot_logits(hidden [M, K], weight [V, K], base, slot [M], width, num_slots, extra_id)` -> [M, width + 1]
float32: column c < width is `hidden[m] . weight[base + width * slot[m] + c]`, column `width` is
`hidden[m] . weight[extra_id]`, each accumulated in float32 and rounded to hidden's dtype (as `hidden @ w.T` in
that dtype and then `.float()` would give), stored as float32.

The kernel's grid depends only on the Python ints (graph-safe: no host sync, no value-dependent shapes): one
program per (slot s, column block j) plus one for the extra column. Program (s, j) loads the rows' slots (M <= 16)
and returns at once when no row is at slot s; otherwise it reads weight rows `base + width * s + j * BLOCK_N ..`
once, computes every row's dot products (the tensor cores over the rows padded to 16, or FMAs over the rows'
power-of-two bucket) and stores those of the rows at slot s. So a step reads the windows of the slots present,
once each, whatever the number of rows at each. A slot outside [0, num_slots) gets no logits (its row is left
uninitialised): callers pass slots in range.

Returns None (the caller runs its PyTorch code) without Triton, for non-CUDA tensors, for M = 0 or M > 16, when
hidden's and weight's dtypes differ or the weight is not contiguous, or with `VOX_SLOT_HEAD=0`.
`DEFAULT_CONFIG` was measured on an H200 (`python tests/test_slot_head.py bench`, in
benchmark/results/h200-2026-12-03/slot_head.txt): 10.4 us per call at 1 to 16 rows on one slot, 43 us with the
rows over all 7 slots, against 56-60 us for the PyTorch path. `FLOAT32_CONFIG` (tests and float32 checkpoints)
is not tuned.
Tests run the kernel through Triton's interpreter on the CPU with a forced configuration (`forced`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from vox_serve.rt import pdl, triton_ops

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton: the caller's PyTorch code runs
    triton = None

MAX_ROWS = 16


@dataclass(frozen=True)
class BlockConfig:
    """Column block, K block, warps and pipeline stages; `dot` uses the tensor cores (rows padded to 16), else
    FMAs over the rows' power-of-two bucket."""

    block_n: int
    block_k: int
    warps: int = 4
    dot: bool = True
    stages: int = 3


# See the module docstring. float32 goes through FMAs: tl.dot would take it as TF32.
DEFAULT_CONFIG = BlockConfig(block_n=32, block_k=128, warps=4, dot=True, stages=3)
FLOAT32_CONFIG = BlockConfig(block_n=16, block_k=64, warps=4, dot=False, stages=2)

Chooser = Callable[[int, int, torch.dtype], "BlockConfig | None"]  # (rows, K, dtype) -> configuration
forced: Chooser | None = None  # tests: a configuration for any device and dtype (the interpreter on the CPU)


def rows_bucket(m: int) -> int:
    return 1 << max(m - 1, 0).bit_length()


def _config(hidden: Tensor, weight: Tensor, slot: Tensor) -> BlockConfig | None:
    if hidden.dim() != 2 or weight.dim() != 2 or slot.dim() != 1:
        return None
    m, k = hidden.shape
    if m == 0 or m > MAX_ROWS or slot.shape[0] != m or weight.shape[1] != k or not weight.is_contiguous():
        return None
    if hidden.dtype != weight.dtype or hidden.device != weight.device:
        return None
    if forced is not None:
        return forced(m, k, hidden.dtype) if triton is not None else None
    if not (triton_ops.enabled(hidden) and os.environ.get("VOX_SLOT_HEAD", "1") != "0"):
        return None
    if hidden.dtype in (torch.bfloat16, torch.float16):
        return DEFAULT_CONFIG
    return FLOAT32_CONFIG if hidden.dtype == torch.float32 else None


def slot_logits(hidden: Tensor, weight: Tensor, base: int, slot: Tensor, width: int, num_slots: int,
                extra_id: int) -> Tensor | None:
    """[M, width + 1] float32 logits of each row over its window `base + width * slot[m] + [0, width)` and the
    row `extra_id` (the last column); None where the kernel does not serve (see the module docstring)."""
    config = _config(hidden, weight, slot)
    if config is None:
        return None
    vocab = weight.shape[0]
    if width <= 0 or num_slots <= 0 or base < 0 or base + width * num_slots > vocab or not 0 <= extra_id < vocab:
        raise ValueError(f"windows [{base}, {base + width * num_slots}) or extra id {extra_id} outside the "
                         f"weight's {vocab} rows")
    m, k = hidden.shape
    hidden = hidden.contiguous()
    slot = slot.to(torch.int64).contiguous()
    out = torch.empty(m, width + 1, dtype=torch.float32, device=hidden.device)
    blocks = triton.cdiv(width, config.block_n)
    grid = (num_slots * blocks + 1,)
    _slot_logits_kernel[grid](
        hidden, weight, slot, out, m, base, extra_id, K=k, WIDTH=width, BLOCKS=blocks, NUM_SLOTS=num_slots,
        DOT=config.dot, IEEE=hidden.dtype == torch.float32, BLOCK_M=MAX_ROWS if config.dot else rows_bucket(m),
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.warps, num_stages=config.stages,
        **pdl.launch_options(hidden))
    return out


if triton is not None:

    @triton.jit
    def _round_to(x, dtype: tl.constexpr):
        """float32 x rounded to `dtype` (to nearest, ties to even: as the unfused product's output is), as float32.
        bfloat16 by its bits: the same on the GPU and in the interpreter (whose float32 -> bfloat16 cast
        truncates)."""
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
            out = bits.to(tl.float32, bitcast=True)
        else:
            out = x.to(dtype).to(tl.float32)
        return out

    # Program pid < NUM_SLOTS * BLOCKS: slot pid // BLOCKS, column block pid % BLOCKS of its window; the last
    # program: the extra column (weight row extra_id, output column WIDTH) for every row, in the same code with
    # one valid column. `m`, `base` and `extra_id` are not specialised on (one compiled kernel per shape class).
    @triton.jit(do_not_specialize=["m", "base", "extra_id"])
    def _slot_logits_kernel(h_ptr, w_ptr, slot_ptr, out_ptr, m, base, extra_id, K: tl.constexpr,
                            WIDTH: tl.constexpr, BLOCKS: tl.constexpr, NUM_SLOTS: tl.constexpr, DOT: tl.constexpr,
                            IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        pdl.enter(PDL)
        pid = tl.program_id(0)
        is_extra = pid == NUM_SLOTS * BLOCKS
        s = pid // BLOCKS
        j = pid % BLOCKS
        rm = tl.arange(0, BLOCK_M)
        m_mask = rm < m
        slots = tl.load(slot_ptr + rm, mask=m_mask, other=-1)
        need = (m_mask & (slots == s)) | (rm < tl.where(is_extra, m, 0))  # the extra program: every row
        if tl.sum(need.to(tl.int32), axis=0) > 0:
            window_row = base.to(tl.int64) + WIDTH * s.to(tl.int64) + j.to(tl.int64) * BLOCK_N
            row0 = tl.where(is_extra, extra_id.to(tl.int64), window_row)
            col0 = tl.where(is_extra, WIDTH, j * BLOCK_N)
            valid = tl.where(is_extra, 1, WIDTH - j * BLOCK_N)  # columns of this block inside the window
            rn = tl.arange(0, BLOCK_N)
            n_mask = rn < valid
            w_rows = (row0 + rn.to(tl.int64)) * K
            if DOT:
                acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            else:
                acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                rk = k0 + tl.arange(0, BLOCK_K)
                k_mask = rk < K
                w = tl.load(w_ptr + w_rows[:, None] + rk[None, :], mask=n_mask[:, None] & k_mask[None, :],
                            other=0.0)
                a = tl.load(h_ptr + rm[:, None] * K + rk[None, :], mask=m_mask[:, None] & k_mask[None, :],
                            other=0.0)
                if DOT:
                    if IEEE:
                        acc += tl.dot(a, tl.trans(w), input_precision="ieee")
                    else:
                        acc += tl.dot(a, tl.trans(w))
                else:
                    acc += a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
            if not DOT:
                acc = tl.sum(acc, axis=2)
            logits = _round_to(acc, h_ptr.dtype.element_ty)
            tl.store(out_ptr + rm[:, None] * (WIDTH + 1) + col0 + rn[None, :], logits,
                     mask=need[:, None] & n_mask[None, :])

"""Projections of a few rows (decode at small batch): one Triton kernel per projection, with the RMSNorm
before it and the SwiGLU gate after it folded in.

At batch 1 a decoder layer is launch-bound, not bandwidth-bound: cuBLAS picks tiles with as few as 16
thread blocks for a 1024-wide output (Qwen3-TTS's code predictor: 11 us to read 4 MB, where the HBM
needs 1.3), adds a split-K reduce kernel to others, and the norm and the SwiGLU gate are kernels of their
own. `linear`, `norm_linear` and `norm_gated` do each projection in one launch over many small column
blocks: the input rows (M <= 16) are re-read by every block, the weight once.

- `linear(x, W, b)`: x @ W.T (+ b);
- `norm_linear(x, delta, norm, W)`: (x + delta, RMSNorm(x + delta) @ W.T): the residual add and the norm
  in the same pass over K as the weight (each block sums the rows' squares and scales its dot products by
  1 / rms, a per-row factor, at the end; block 0 writes the sum);
- `norm_gated(x, delta, norm, W)`: the same with W the fused gate/up weight [2I, K], returning
  silu(gate) * up [M, I]: both halves' columns in the same block;
- `gated_linear(gate_up, W)`: (silu(gate) * up) @ W.T for a gate/up projection's output [M, 2K]: the SwiGLU
  gate computed as the down projection loads its input (where the gate/up projection itself stays cuBLAS's).

Each takes `scale` for a float8 weight (rt/fp8_gemm, `--quantization fp8`): W [N, K] in e4m3 with one float32
scale per output row, converted as it loads and the products scaled once per column after the K loop (what
`fp8_gemm.reference_linear` computes). Such a weight takes its own table entries (dtype "float8_e4m3fn",
`benchmark/small_gemm.py --weights fp8`) where the GPU's table has some for its shape (at the rows without one, the
float8 GEMM), else the entries of the activations' dtype for the same shape.

Rounding follows the unfused ops where the one pass allows: the sum x + delta is rounded to the input dtype, the
gate and up projections are rounded before the gate. The normed rows are not rounded as RMSNorm's output would
be: the FMA path keeps x * norm weight in float32, the tensor-core path rounds it to the input dtype before
the 1 / rms scale, so results differ from the unfused ops by about one rounding of the normed rows (bfloat16:
a few 1e-3 relative).

Which kernel serves a shape is measured, not guessed: a table per GPU model
(`small_gemm_tables/<model>.json`, written by `benchmark/small_gemm.py --table`, or extending another card's table)
gives the block sizes for (kind, dtype, rows bucket, N, K), and a shape it lacks, or a GPU without a table, runs
the unfused ops.
`VOX_SMALL_GEMM=0` turns the kernels off, `VOX_SMALL_GEMM_TABLE` names a JSON table to use instead (one
measured on another GPU).
Tests run the kernels through Triton's interpreter on the CPU with a forced configuration (`forced`).
"""

from __future__ import annotations

import enum
import functools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from vox_serve.rt import pdl, triton_ops

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton: the unfused ops run
    triton = None

MAX_ROWS = 16
FP8 = triton_ops.FP8  # a float8 weight (rt/fp8_gemm), with a scale per output row
TABLES_DIR = Path(__file__).resolve().parent / "small_gemm_tables"


class Kind(enum.Enum):
    PLAIN = "plain"  # x @ W.T (+ bias)
    NORM = "norm"  # RMSNorm(x (+ delta)) @ W.T
    GATED = "gated"  # silu(gate) * up of RMSNorm(x (+ delta)) @ [Wg; Wu].T
    GATED_IN = "gated_in"  # (silu(gate) * up) @ W.T of a gate/up output [M, 2K]


@dataclass(frozen=True)
class BlockConfig:
    """Column block, K block, warps and pipeline stages; `dot` uses the tensor cores (16 rows padded), else FMAs
    over the rows' power-of-two bucket; `unroll` unrolls the K loop instead of pipelining it."""

    block_n: int
    block_k: int
    warps: int = 4
    dot: bool = False
    stages: int = 3
    unroll: bool = False

    def as_list(self) -> list[int]:
        return [self.block_n, self.block_k, self.warps, int(self.dot), self.stages, int(self.unroll)]

    @classmethod
    def of_list(cls, values: list[int]) -> BlockConfig:
        """[block_n, block_k, warps, dot(, stages(, unroll))]: tables written before stages and unroll have 4."""
        bn, bk, warps, dot, *rest = values
        stages = int(rest[0]) if rest else 3
        unroll = bool(rest[1]) if len(rest) > 1 else False
        return cls(bn, bk, warps, bool(dot), stages, unroll)


class Norm(Protocol):
    weight: Tensor
    eps: float


Key = tuple[str, str, int, int, int]  # kind, dtype, rows bucket, N (output columns), K
Chooser = Callable[[Kind, int, int, int], "BlockConfig | None"]
forced: Chooser | None = None  # tests: a configuration for every shape, any dtype and device


def rows_bucket(m: int) -> int:
    return 1 << max(m - 1, 0).bit_length()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def table_from_json(entries: list[dict]) -> dict[Key, BlockConfig]:
    """[{"kind", "dtype", "rows", "n", "k", "config": BlockConfig.as_list()}, ...] -> the table."""
    return {(e["kind"], e["dtype"], int(e["rows"]), int(e["n"]), int(e["k"])): BlockConfig.of_list(e["config"])
            for e in entries}


def read_layered(path: Path, directory: Path, parse: Callable[[list[dict]], dict]) -> dict:
    """A table file's entries (`parse`d); one with `"extends": "<packaged table>.json"` is that table of
    `directory` with its own entries on top (another card of the same architecture, where a few shapes measured
    otherwise, or a sweep's winners over the packaged table). rt/fp8_gemm's tables are read the same way."""
    data = json.loads(path.read_text())
    base = read_layered(directory / data["extends"], directory, parse) if "extends" in data else {}
    return base | parse(data["entries"])


def read_table(path: Path) -> dict[Key, BlockConfig]:
    """A table file (`read_layered`)."""
    return read_layered(path, TABLES_DIR, table_from_json)


def table_path(device_name: str, directory: Path = TABLES_DIR) -> Path:
    """The packaged table of a GPU model: "NVIDIA H200" -> small_gemm_tables/nvidia-h200.json (rt/fp8_gemm's
    tables are named the same in their own directory)."""
    return directory / (re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") + ".json")


@functools.cache
def _table(device_index: int) -> dict[Key, BlockConfig]:
    """The device's table, read once (empty when VOX_SMALL_GEMM=0 or there is none)."""
    if os.environ.get("VOX_SMALL_GEMM", "1") == "0":
        return {}
    path = Path(os.environ.get("VOX_SMALL_GEMM_TABLE") or table_path(torch.cuda.get_device_name(device_index)))
    if not path.is_file():
        return {}
    return read_table(path)


def _config(x: Tensor, weight: Tensor, kind: Kind, n: int, scale: Tensor | None) -> BlockConfig | None:
    m, width = x.shape if x.dim() == 2 else (MAX_ROWS + 1, 0)
    k = width // 2 if kind is Kind.GATED_IN else width  # the gated input: gate and up halves of K each
    odd_gated = kind is Kind.GATED_IN and width % 2 == 1
    if m == 0 or m > MAX_ROWS or weight.shape[-1] != k or odd_gated or not weight.is_contiguous():
        return None
    if (scale is not None) != (weight.dtype == FP8):
        raise ValueError(f"a {weight.dtype} weight {'takes no' if scale is not None else 'needs its'} scale")
    if forced is not None:
        return forced(kind, m, n, k) if triton is not None else None
    if not (triton_ops.enabled(x) and x.is_cuda and (scale is not None or x.dtype == weight.dtype)):
        return None
    device = x.device.index or 0
    key = (kind.value, _dtype_name(weight.dtype), rows_bucket(m), n, k)
    if scale is not None and (kind.value, n, k) not in _measured_fp8(device):  # the activations' entry until
        key = (kind.value, _dtype_name(x.dtype), *key[2:])  # the float8 weights of this shape are measured here
    return _table(device).get(key)


@functools.cache
def _measured_fp8(device_index: int) -> frozenset[tuple[str, int, int]]:
    """The (kind, N, K) shapes with float8-weight entries in the device's table: at the rows without one, such a
    shape runs the float8 GEMM."""
    return frozenset((key[0], key[3], key[4]) for key in _table(device_index) if key[1] == _dtype_name(FP8))


def serves(x: Tensor, weight: Tensor, *, scale: Tensor | None = None) -> bool:
    """Whether `linear(x, weight, scale=scale)` runs a kernel here (x's shape, dtype and device are what count)."""
    return _config(x, weight, Kind.PLAIN, weight.shape[0], scale) is not None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, scale: Tensor | None = None) -> Tensor | None:
    """x [M, K] @ weight [N, K].T (+ bias [N]) -> [M, N], or None where no measured kernel serves the shape."""
    config = _config(x, weight, Kind.PLAIN, weight.shape[0], scale)
    if config is None:
        return None
    return _launch(config, x.contiguous(), None, None, weight, bias, n=weight.shape[0], gated=False, eps=0.0,
                   scale=scale)[1]


def gated_linear(gate_up: Tensor, weight: Tensor, bias: Tensor | None = None, *,
                 scale: Tensor | None = None) -> Tensor | None:
    """(silu(gate) * up) @ weight [N, K].T (+ bias) for gate_up [M, 2K] (gate, then up), the gate rounded to the
    input dtype as `triton_ops.silu_mul`'s output is; None where no measured kernel serves the shape."""
    config = _config(gate_up, weight, Kind.GATED_IN, weight.shape[0], scale)
    if config is None:
        return None
    return _launch(config, gate_up.contiguous(), None, None, weight, bias, n=weight.shape[0], gated=False,
                   eps=0.0, gated_in=True, scale=scale)[1]


def norm_linear(x: Tensor, delta: Tensor | None, norm: Norm, weight: Tensor, out_dtype: torch.dtype | None = None,
                *, scale: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """(x + delta, RMSNorm(x + delta) @ weight.T), x itself when delta is None; None where not served. With
    `out_dtype` (float32: logits for a sampler) the product, rounded to x's dtype as ever, is stored in that
    dtype: what `.to(out_dtype)` of the usual output gives, without that launch."""
    config = _config(x, weight, Kind.NORM, weight.shape[0], scale)
    if config is None:
        return None
    return _launch(config, x.contiguous(), delta, norm.weight, weight, None, n=weight.shape[0], gated=False,
                   eps=norm.eps, out_dtype=out_dtype, scale=scale)


def norm_gated(x: Tensor, delta: Tensor | None, norm: Norm, weight: Tensor, *,
               scale: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """(x + delta, silu(g) * u) with [g, u] = RMSNorm(x + delta) @ weight.T split in halves; None where not served."""
    config = _config(x, weight, Kind.GATED, weight.shape[0] // 2, scale)
    if config is None or weight.shape[0] % 2:
        return None
    return _launch(config, x.contiguous(), delta, norm.weight, weight, None, n=weight.shape[0] // 2, gated=True,
                   eps=norm.eps, scale=scale)


def _launch(config: BlockConfig, x: Tensor, delta: Tensor | None, norm_weight: Tensor | None, weight: Tensor,
            bias: Tensor | None, *, n: int, gated: bool, eps: float, gated_in: bool = False,
            out_dtype: torch.dtype | None = None, scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    m, k = x.shape[0], weight.shape[1]
    out = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    total = torch.empty_like(x) if delta is not None else x
    delta = delta.contiguous() if delta is not None else x
    block_m = MAX_ROWS if config.dot else rows_bucket(m)
    grid = (triton.cdiv(n, config.block_n),)
    _small_linear_kernel[grid](
        x, delta, norm_weight if norm_weight is not None else x, total, weight, bias if bias is not None else x,
        scale if scale is not None else x, out, m, n, eps, K=k, HAS_DELTA=total is not x,
        NORM=norm_weight is not None, GATED=gated, GATED_IN=gated_in, HAS_BIAS=bias is not None,
        SCALED=scale is not None, DOT=config.dot, UNROLL=config.unroll, BLOCK_M=block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, num_warps=config.warps, num_stages=config.stages,
        **pdl.launch_options(x))
    return total, out


if triton is not None:

    @triton.jit
    def _rows(x_ptr, d_ptr, rm, rk, mask, K, HAS_DELTA: tl.constexpr, GATED_IN: tl.constexpr):
        """The input rows' [BLOCK_M, BLOCK_K] block in float32: x + delta rounded to x's dtype, or (GATED_IN, x
        [M, 2K]) silu(gate) * up rounded to it."""
        if GATED_IN:
            offs = rm[:, None] * (2 * K) + rk[None, :]
            gate = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            up = tl.load(x_ptr + offs + K, mask=mask, other=0.0).to(tl.float32)
            return (gate / (1.0 + tl.exp(-gate)) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
        offs = rm[:, None] * K + rk[None, :]
        a = tl.load(x_ptr + offs, mask=mask, other=0.0)
        if HAS_DELTA:
            d = tl.load(d_ptr + offs, mask=mask, other=0.0)
            a = (a.to(tl.float32) + d.to(tl.float32)).to(x_ptr.dtype.element_ty)
        return a.to(tl.float32)

    @triton.jit
    def _times_w(acc, a, w, dtype: tl.constexpr, DOT: tl.constexpr, ROW: tl.constexpr):
        """acc + a [BLOCK_M, BLOCK_K] @ w [BLOCK_N, BLOCK_K].T: on the tensor cores in the activations' `dtype`
        (acc [BLOCK_M, BLOCK_N]; a float8 weight converted to it), or as FMAs into acc [BLOCK_M, BLOCK_N, BLOCK_K],
        reduced over K once after the loop; ROW (one row, FMAs): a is the row repeated [BLOCK_N, BLOCK_K] and acc
        [BLOCK_N, BLOCK_K]."""
        if DOT:
            out = acc + tl.dot(a.to(dtype), tl.trans(w.to(dtype)))
        elif ROW:
            out = acc + a * w.to(tl.float32)
        else:
            out = acc + a[:, None, :] * w.to(tl.float32)[None, :, :]
        return out

    @triton.jit
    def _k_step(k0, x_ptr, d_ptr, nw_ptr, sum_ptr, w_ptr, rm, m_mask, write_rows, rn, n_mask, acc, acc_up, squares, N,
                K: tl.constexpr, HAS_DELTA: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
                GATED_IN: tl.constexpr, DOT: tl.constexpr, ROW: tl.constexpr, BLOCK_K: tl.constexpr):
        """One K block: the weight rows loaded first, then the input rows (their squares summed for the norm, the
        sum written by block 0), scaled by the norm's weight; 1 / rms is a per-row factor applied after the loop.
        ROW (one row on FMAs): the product's input row is loaded again repeated per weight row, [BLOCK_N, BLOCK_K]
        like the weight (the repeats from L1), so the weight keeps its load layout: multiplying it by a [1, BLOCK_K]
        row made Triton move every weight element through shared memory (byte stores and four barriers per K
        block in a float8 weight's SASS)."""
        rk = k0 + tl.arange(0, BLOCK_K)
        k_mask = rk < K
        w_mask = n_mask[:, None] & k_mask[None, :]
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=w_mask, other=0.0)
        if GATED:
            w_up = tl.load(w_ptr + (rn + N)[:, None] * K + rk[None, :], mask=w_mask, other=0.0)
        if NORM or not ROW:
            a = _rows(x_ptr, d_ptr, rm, rk, m_mask[:, None] & k_mask[None, :], K, HAS_DELTA, GATED_IN)
            if NORM:
                squares += a * a
                if HAS_DELTA:
                    tl.store(sum_ptr + rm[:, None] * K + rk[None, :], a.to(sum_ptr.dtype.element_ty),
                             mask=write_rows[:, None] & k_mask[None, :])
        if ROW:
            a = _rows(x_ptr, d_ptr, rn * 0, rk, w_mask, K, HAS_DELTA, GATED_IN)
        if NORM:  # the norm's weight in the product's layout
            if ROW:
                a = a * tl.load(nw_ptr + rn[:, None] * 0 + rk[None, :], mask=w_mask, other=0.0).to(tl.float32)
            else:
                a = a * tl.load(nw_ptr + rk, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        acc = _times_w(acc, a, w, x_ptr.dtype.element_ty, DOT, ROW)
        if GATED:
            acc_up = _times_w(acc_up, a, w_up, x_ptr.dtype.element_ty, DOT, ROW)
        return acc, acc_up, squares

    @triton.jit
    def _accumulator(DOT: tl.constexpr, ROW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
        """The products' float32 accumulator: [BLOCK_M, BLOCK_N] on the tensor cores, [BLOCK_N, BLOCK_K] for one
        row on FMAs (ROW), else [BLOCK_M, BLOCK_N, BLOCK_K]."""
        if DOT:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        elif ROW:
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
        return acc

    @triton.jit
    def _reduced(acc, DOT: tl.constexpr, ROW: tl.constexpr):
        """An `_accumulator` after the K loop as [BLOCK_M, BLOCK_N]: the FMA forms summed over their K lanes."""
        if ROW:
            out = tl.sum(acc, axis=1)[None, :]
        elif DOT:
            out = acc
        else:
            out = tl.sum(acc, axis=2)
        return out

    # One column block: one pass over K reading the block's weight rows (and, GATED, the up half's rows at n + the
    # same columns) and the input rows, then the rows' 1 / rms, the bias or the gate, rounded to the output dtype.
    # UNROLL unrolls the K loop (all its loads can be in flight at once); otherwise num_stages pipelines it. Block 0
    # writes the sums x + delta. Shared by the one-projection kernel below and rt/depth_step's persistent kernel.
    @triton.jit
    def column_block(pid, x_ptr, d_ptr, nw_ptr, sum_ptr, w_ptr, b_ptr, s_ptr, out_ptr, m, N, eps, K: tl.constexpr,
                     HAS_DELTA: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, GATED_IN: tl.constexpr,
                     HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, DOT: tl.constexpr, UNROLL: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        ROW: tl.constexpr = BLOCK_M == 1 and not DOT  # one row on FMAs (_k_step)
        rm = tl.arange(0, BLOCK_M)
        m_mask = rm < m
        write_rows = rm < tl.where(pid == 0, m, 0)  # block 0 writes the sums
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = rn < N
        dtype = x_ptr.dtype.element_ty
        acc = _accumulator(DOT, ROW, BLOCK_M, BLOCK_N, BLOCK_K)
        acc_up = tl.zeros_like(acc)
        squares = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        if UNROLL:
            for k0 in tl.static_range(0, K, BLOCK_K):
                acc, acc_up, squares = _k_step(k0, x_ptr, d_ptr, nw_ptr, sum_ptr, w_ptr, rm, m_mask, write_rows, rn,
                                               n_mask, acc, acc_up, squares, N, K, HAS_DELTA, NORM, GATED,
                                               GATED_IN, DOT, ROW, BLOCK_K)
        else:
            for k0 in range(0, K, BLOCK_K):
                acc, acc_up, squares = _k_step(k0, x_ptr, d_ptr, nw_ptr, sum_ptr, w_ptr, rm, m_mask, write_rows, rn,
                                               n_mask, acc, acc_up, squares, N, K, HAS_DELTA, NORM, GATED,
                                               GATED_IN, DOT, ROW, BLOCK_K)
        acc = _reduced(acc, DOT, ROW)
        acc_up = _reduced(acc_up, DOT, ROW)
        if SCALED:  # a float8 weight's per-row scales (the up half's rows at n + N)
            acc = acc * tl.load(s_ptr + rn, mask=n_mask, other=0.0)[None, :]
            if GATED:
                acc_up = acc_up * tl.load(s_ptr + rn + N, mask=n_mask, other=0.0)[None, :]
        if NORM:
            inv = 1.0 / tl.sqrt(tl.sum(squares, axis=1) / K + eps)
            acc = acc * inv[:, None]
            acc_up = acc_up * inv[:, None]
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if GATED:
            gate = acc.to(dtype).to(tl.float32)
            acc = gate / (1.0 + tl.exp(-gate)) * acc_up.to(dtype).to(tl.float32)
        out = acc.to(dtype).to(out_ptr.dtype.element_ty)  # rounded to the input dtype, stored in the output's
        tl.store(out_ptr + rm[:, None] * N + rn[None, :], out, mask=m_mask[:, None] & n_mask[None, :])

    # One program per column block.
    @triton.jit(do_not_specialize=["m", "eps"])
    def _small_linear_kernel(x_ptr, d_ptr, nw_ptr, sum_ptr, w_ptr, b_ptr, s_ptr, out_ptr, m, N, eps,
                             K: tl.constexpr, HAS_DELTA: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
                             GATED_IN: tl.constexpr, HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,
                             DOT: tl.constexpr, UNROLL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        pid = tl.program_id(0)
        pdl.enter(PDL)
        column_block(pid, x_ptr, d_ptr, nw_ptr, sum_ptr, w_ptr, b_ptr, s_ptr, out_ptr, m, N, eps, K, HAS_DELTA, NORM,
                     GATED, GATED_IN, HAS_BIAS, SCALED, DOT, UNROLL, BLOCK_M, BLOCK_N, BLOCK_K)

"""Decode attention over the paged KV cache in one Triton kernel that needs no host planning, for the few-row
decode buckets (FlashInferAttentionBackend serves those of its CUDA-core geometries with it, see there;
`VOX_TRITON_DECODE=0` keeps FlashInfer's).

A decode launch at a few rows is latency-bound: FlashInfer's graph-mode decode plans on the host, then runs a
split-KV kernel and a merge kernel (Orpheus 3B on an H200, 1 row, 512 tokens: ~11 us per layer for ~2 MB of KV).
This kernel reads what the stage already has on the device, the rows' page tables and KV lengths, and merges its
splits itself, so it needs no plan. (The backend still plans FlashInfer's wrapper of the bucket, unread by the
captured graph, so both runtimes keep one planner per captured decode bucket, as the engine spec publishes them.)

Grid (rows, kv heads, SPLITS), fixed per captured batch bucket. Program (r, h, s) takes the s-th of SPLITS equal
runs of row r's KV blocks (BLOCK_N tokens each; a run past the row's length is empty), attends the row's G query
heads of KV head h over it (online softmax in float32, the tensor cores over the G heads padded to 16 with `dot`,
else FMAs over the heads' power of two), and stores its partial (running max, sum, unnormalised output). The
last of a (row, head)'s SPLITS programs to finish (an atomic counter, reset by it) merges the partials and
writes the output. Split 0 always covers the row's first block, so every merge has a finite maximum (padded rows
have KV length 1: the null page).

`decode_attention(q [T, Hq, D], cache [P, 2, page, Hkv, D], page_table [T, C] int32, kv_lens [T] int32, ...)`
-> [T, Hq, D] in q's dtype; q's row t attends to its row's first kv_lens[t] tokens (its own already written).
K and V are converted to q's dtype as they load, so the cache may be stored narrower (float8, the `triton`
backend's `--kv-cache-dtype fp8`). With `DecodeConfig.f16` ("/f" in a configuration's name) a float8 cache under
a 16-bit q is converted to float16 instead (`F16`): one instruction per pair of values on sm_89+ (F2FP), where
reaching bfloat16 also takes a float32 step per value (F2F). q is multiplied by the softmax scale before its own
conversion to float16, so no score can overflow it. Compiled for sm_90 (nvdisasm), a 128-token block's program
drops from 1992 to 1616 instructions (its 256 F2F gone). On an H100 (benchmark/results/h100-2026-12-07f), Orpheus'
geometry, us per layer launch with 128-token blocks: 256 rows x 512 tokens 126.5 -> 121.9 (one read of the layer's
cache: 92.8), 256 x 1024 239.0 -> 227.4, 64 x 512 38.8 -> 35.5; the captured 256-row step 7.386 -> 7.132 ms. So
the large-batch float8 configuration (FP8_LARGE) takes it; with 64-token blocks it lost (64 x 512: 37.4 -> 48.9),
so FP8_SMALL does not.

Measured on an H200 (benchmark/results/h200-2026-12-03d/decode_attention.txt; `benchmark/decode_attention.py`),
microseconds per layer launch in a CUDA graph against FlashInfer's graph-mode decode: Orpheus-3B's geometry at 1
row 7.1 against 9.7 (tensor cores) at 256 tokens, 10.7 against 11.6 at 1024; Qwen3-TTS's 6.3 against 8.9 and 9.1
against 10.3 (CUDA cores); at 2 rows 8.4 / 12.3 against 10.1-10.6 / 11.0-12.6; from 4 rows on the two trade places
by length, so FlashInfer keeps the buckets of 3-15 rows (MAX_ROWS); from 16 to 256 rows (WIDE_ROWS) the kernel
serves every geometry: it won in the captured step of both models on an H100 at 16-64 rows, and at 256 once its
blocks grew to 128 tokens (`config_for`; benchmark/results/h100-2026-12-06 and -07c;
`VOX_TRITON_DECODE_ROWS=N` serves every bucket up to N rows instead, for
A/B measurements; alone it led at 64 rows, Orpheus' geometry 38.9 us against 47.3, in
benchmark/results/h200-2026-12-03e). In the captured decode step (graph_ms) it gained for
Qwen3-TTS's talker (group 2: 3.667 -> 3.615 ms at 1 row) and lost for Orpheus (group 3: 2.098 -> 2.119 ms), whose
decode FlashInfer runs on its tensor cores. It does not take part in programmatic dependent launch (rt/pdl.py):
as a participant it was slower still (Orpheus 2.141 ms at 1 row with `VOX_TRITON_DECODE=all`, the Qwen3-TTS frame
3.647 ms; benchmark/results/h200-2026-12-03e).
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
except Exception:  # noqa: BLE001 - no Triton: FlashInfer serves every bucket
    triton = None

ENV = "VOX_TRITON_DECODE"
MAX_ROWS = 2  # the decode buckets served by default where FlashInfer's decode would run on CUDA cores
# and these at every geometry: measured in the captured step on an H100 (benchmark/results/h100-2026-12-06,
# graph ms with FlashInfer / this kernel): Orpheus-3B 16 rows 3.381 / 3.324, 64: 4.787 / 4.434; at 256 rows
# the kernel lost with 32-token blocks (Orpheus 9.536 / 9.634, the Qwen3-TTS frame 14.90 / 15.36) and wins with
# WIDE_LARGE's 128: Orpheus offline, 256 at once, 227.5x -> 235.5x real time (underruns 7043 -> 3637), Qwen3-TTS
# 691.3x -> 690.4x, in one call (benchmark/results/h100-2026-12-07c)
WIDE_ROWS = range(16, 257)
ROWS_ENV = "VOX_TRITON_DECODE_ROWS"  # a row limit instead (every bucket up to it), for A/B measurements

# Programs per step the split count aims at (a few per SM), and its bounds.
PROGRAMS_PER_SM = 2
MAX_SPLITS = 32


@dataclass(frozen=True)
class DecodeConfig:
    """KV tokens per block, warps, pipeline stages; `dot`: the tensor cores (heads padded to 16), else FMAs;
    `head_major`: consecutive programs take a row's KV heads (which share its pages) rather than the rows (on an
    H100 within a few percent of row-major either way, benchmark/results/h100-2026-12-07c: off)."""

    block_n: int = 32
    warps: int = 4
    stages: int = 2
    dot: bool = True
    head_major: bool = False
    f16: bool = False  # a float8 cache's K and V converted to float16 for a 16-bit q (one instruction per pair),
    # else to q's dtype

    @property
    def name(self) -> str:
        """"BLOCK_N/WARPS/STAGES[/h][/f]", what `parse` reads."""
        flags = ("/h" if self.head_major else "") + ("/f" if self.f16 else "")
        return f"{self.block_n}/{self.warps}/{self.stages}{flags}"

    @classmethod
    def parse(cls, text: str) -> DecodeConfig:
        """"BLOCK_N/WARPS/STAGES", then "/h" for head-major programs and "/f" for a float8 cache converted to
        float16 rather than q's dtype: "64/4/3/h"."""
        parts = text.strip().split("/")
        flags = parts[3:]
        if len(parts) < 3 or len(flags) != len(set(flags)) or not set(flags) <= {"h", "f"} or not all(
                p.isdigit() and int(p) > 0 for p in parts[:3]):
            raise ValueError(f"decode config {text!r}: use BLOCK_N/WARPS/STAGES[/h][/f], e.g. 64/4/3")
        return cls(block_n=int(parts[0]), warps=int(parts[1]), stages=int(parts[2]), head_major="h" in flags,
                   f16="f" in flags)


DEFAULT_CONFIG = DecodeConfig()
CONFIG_ENV = "VOX_TRITON_DECODE_CONFIG"  # one configuration for every launch instead, for A/B measurements


@functools.cache
def _forced_config(value: str) -> DecodeConfig | None:
    return DecodeConfig.parse(value) if value.strip() else None


# Measured alone on an H100 (benchmark/results/h100-2026-12-07c, sweep*.txt; us per layer launch, Orpheus'
# geometry): over a float8 cache 128-token blocks won at 256 rows (512 tokens: 127.2 against 156.8 with the
# default; 1024: 235.7 against 304.6) and 64-token blocks at 1-64 rows (1 row 7.7 against 9.2 with 128); over a
# bfloat16 cache 128-token blocks with 3 stages won at 64 and 256 rows for both geometries (Orpheus 256 x 512:
# 184.4 against 195.6 with the default and FlashInfer's 196.3; Qwen3-TTS 183.4 against FlashInfer's 186.5). In
# Orpheus' captured step at 64 rows, though, the bfloat16 kernel took 1.523 ms with 128-token blocks against
# 1.400 with the default (another H100, benchmark/results/h100-2026-12-07b), so they start above 64 rows.
LARGE_ROWS = 64  # above this bucket the large-batch configurations
FP8_LARGE = DecodeConfig(block_n=128, warps=4, stages=2, f16=True)  # float16 conversion: h100-2026-12-07f
FP8_SMALL = DecodeConfig(block_n=64, warps=4, stages=2)
WIDE_LARGE = DecodeConfig(block_n=128, warps=4, stages=3)


BLOCKS = tuple(sorted({c.block_n for c in (DEFAULT_CONFIG, FP8_SMALL, FP8_LARGE, WIDE_LARGE)}))


def blocks_fit(page_size: int) -> bool:
    """Whether every measured configuration's KV block (BLOCKS) divides or is divided by the page size."""
    return all(block % page_size == 0 or page_size % block == 0 for block in BLOCKS)


def config_for(rows: int, cache_dtype: torch.dtype) -> DecodeConfig:
    """The configuration of a launch of `rows` rows over a cache of cache_dtype: VOX_TRITON_DECODE_CONFIG's when
    set, else the measured one (above)."""
    forced = _forced_config(os.environ.get(CONFIG_ENV, ""))
    if forced is not None:
        return forced
    if cache_dtype.itemsize == 1:
        return FP8_LARGE if rows > LARGE_ROWS else FP8_SMALL
    return WIDE_LARGE if rows > LARGE_ROWS else DEFAULT_CONFIG


def splits_for(rows: int, num_kv_heads: int, num_sms: int, per_sm: int = PROGRAMS_PER_SM) -> int:
    """Splits per (row, KV head) for a bucket of `rows`: a power of two near `per_sm` programs per SM."""
    want = max(1, -(-per_sm * num_sms // (rows * num_kv_heads)))
    return min(MAX_SPLITS, 1 << (want - 1).bit_length())


@dataclass
class DecodeWorkspace:
    """The partials and counters of one bucket's launches (reused by every layer: launches run in order)."""

    partial_out: Tensor  # [rows, Hkv, SPLITS, G, D] float32: unnormalised outputs of the non-empty splits
    partial_ml: Tensor  # [rows, Hkv, SPLITS, 2, G] float32: their running max (log2 units) and sum
    counters: Tensor  # [rows, Hkv] int32, zero between launches

    @classmethod
    def allocate(cls, rows: int, num_kv_heads: int, group: int, head_dim: int, splits: int,
                 device: torch.device) -> DecodeWorkspace:
        f32 = dict(dtype=torch.float32, device=device)
        return cls(partial_out=torch.zeros(rows, num_kv_heads, splits, group, head_dim, **f32),
                   partial_ml=torch.zeros(rows, num_kv_heads, splits, 2, group, **f32),
                   counters=torch.zeros(rows, num_kv_heads, dtype=torch.int32, device=device))

    @property
    def splits(self) -> int:
        return self.partial_out.shape[2]


class BucketWorkspaces:
    """A backend's workspaces, one per decode bucket (its rows), allocated at the bucket's first launch on a CUDA
    device with the split count its SMs call for (`splits_for`)."""

    def __init__(self, num_kv_heads: int, group: int, head_dim: int) -> None:
        self.num_kv_heads, self.group, self.head_dim = num_kv_heads, group, head_dim
        self._by_rows: dict[int, DecodeWorkspace] = {}

    def of(self, q: Tensor) -> DecodeWorkspace:
        """The workspace of q's bucket."""
        rows = q.shape[0]
        if rows not in self._by_rows:
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            self._by_rows[rows] = DecodeWorkspace.allocate(rows, self.num_kv_heads, self.group, self.head_dim,
                                                           splits_for(rows, self.num_kv_heads, sms), q.device)
        return self._by_rows[rows]


def group_pad(group: int, config: DecodeConfig) -> int:
    return 16 if config.dot else 1 << max(group - 1, 0).bit_length()


def decode_attention(q: Tensor, cache: Tensor, page_table: Tensor, kv_lens: Tensor, scale: float,
                     workspace: DecodeWorkspace, config: DecodeConfig | None = None) -> Tensor:
    """See the module docstring. `workspace` was allocated for at least q's rows and this geometry; `config`
    defaults to config_for(rows, cache dtype)."""
    config = config or config_for(q.shape[0], cache.dtype)
    rows, num_q_heads, head_dim = q.shape
    _, two, page_size, num_kv_heads, cache_dim = cache.shape
    group = num_q_heads // num_kv_heads
    gp = group_pad(group, config)
    if two != 2 or cache_dim != head_dim or group * num_kv_heads != num_q_heads:
        raise ValueError(f"q {tuple(q.shape)} does not fit the cache {tuple(cache.shape)}")
    if workspace.partial_out.shape[0] < rows or workspace.partial_out.shape[1:] != (
            num_kv_heads, workspace.splits, group, head_dim):
        raise ValueError(f"workspace {tuple(workspace.partial_out.shape)} does not serve {rows} rows of this geometry")
    if config.block_n % page_size and page_size % config.block_n:
        raise ValueError(f"block_n {config.block_n} and page size {page_size}: one must divide the other")
    if not cache.is_contiguous():
        raise ValueError("the KV cache must be contiguous")
    out = torch.empty_like(q)
    grid = (num_kv_heads, rows, workspace.splits) if config.head_major else (rows, num_kv_heads, workspace.splits)
    _decode_kernel[grid](
        q, cache, page_table, kv_lens, out, workspace.partial_out, workspace.partial_ml, workspace.counters,
        scale, q.stride(0), q.stride(1), page_table.stride(0), out.stride(0), out.stride(1),
        HKV=num_kv_heads, G=group, G_PAD=gp, D=head_dim, PAGE=page_size, SPLITS=workspace.splits,
        BLOCK_N=config.block_n, DOT=config.dot, HEAD_MAJOR=config.head_major,
        F16=config.f16 and cache.dtype.itemsize == 1 and q.dtype.itemsize == 2, num_warps=config.warps,
        num_stages=config.stages)
    return out


if triton is not None:

    @triton.jit
    def _scores(q, k, DOT: tl.constexpr):
        """[G_PAD, D] x [BLOCK_N, D] -> [G_PAD, BLOCK_N] float32."""
        if DOT:
            s = tl.dot(q, tl.trans(k))
        else:
            s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        return s

    @triton.jit
    def _weighted(p, v, DOT: tl.constexpr):
        """[G_PAD, BLOCK_N] float32 x [BLOCK_N, D] -> [G_PAD, D] float32 (p rounded to v's dtype first, as
        FlashAttention does, when on the tensor cores)."""
        if DOT:
            o = tl.dot(p.to(v.dtype), v)
        else:
            o = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        return o

    @triton.jit
    def _merge(po_ptr, pml_ptr, out_ptr, base, active, row, h, stride_or, stride_oh, G: tl.constexpr,
               D: tl.constexpr, SPLITS: tl.constexpr):
        """The (row, head)'s `active` partials (its non-empty splits) merged into its G output heads, one head
        at a time: [SPLITS, D] per load, the splits' partials read past L1 (other programs wrote them)."""
        rs = tl.arange(0, SPLITS)
        rd = tl.arange(0, D)
        live = rs < active
        for g in tl.static_range(G):
            ml = pml_ptr + ((base + rs) * 2) * G + g
            m = tl.load(ml, mask=live, other=float("-inf"), cache_modifier=".cg")
            l_s = tl.load(ml + G, mask=live, other=0.0, cache_modifier=".cg")
            w = tl.exp2(m - tl.max(m, axis=0))  # split 0 is never empty: a finite maximum
            po = tl.load(po_ptr + ((base + rs[:, None]) * G + g) * D + rd[None, :], mask=live[:, None], other=0.0,
                         cache_modifier=".cg")
            o = tl.sum(w[:, None] * po, axis=0) / tl.sum(w * l_s, axis=0)
            tl.store(out_ptr + row * stride_or + (h * G + g) * stride_oh + rd, o.to(out_ptr.dtype.element_ty))

    @triton.jit
    def _decode_kernel(q_ptr, cache_ptr, pt_ptr, kv_lens_ptr, out_ptr, po_ptr, pml_ptr, counter_ptr, scale,
                       stride_qr, stride_qh, stride_pt, stride_or, stride_oh, HKV: tl.constexpr, G: tl.constexpr,
                       G_PAD: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, SPLITS: tl.constexpr,
                       BLOCK_N: tl.constexpr, DOT: tl.constexpr, HEAD_MAJOR: tl.constexpr, F16: tl.constexpr):
        if HEAD_MAJOR:
            h = tl.program_id(0)
            row = tl.program_id(1)
        else:
            row = tl.program_id(0)
            h = tl.program_id(1)
        s = tl.program_id(2)
        kv_len = tl.load(kv_lens_ptr + row)
        blocks = tl.cdiv(kv_len, BLOCK_N)
        per = tl.cdiv(blocks, SPLITS)
        b0 = s * per
        b1 = tl.minimum(b0 + per, blocks)
        rg = tl.arange(0, G_PAD)
        rd = tl.arange(0, D)
        rn = tl.arange(0, BLOCK_N)
        q = tl.load(q_ptr + row * stride_qr + (h * G + rg[:, None]) * stride_qh + rd[None, :],
                    mask=rg[:, None] < G, other=0.0)
        m_i = tl.full([G_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([G_PAD], tl.float32)
        acc = tl.zeros([G_PAD, D], tl.float32)
        qk_scale = scale * 1.4426950408889634  # exp2 of scores in log2 units
        if F16:  # a float8 cache read as float16: q scaled first (no float16 overflow), the scores as they come
            q = (q.to(tl.float32) * qk_scale).to(tl.float16)
            qk_scale = 1.0
        for b in range(b0, b1):
            t = b * BLOCK_N + rn
            live = t < kv_len
            page = tl.load(pt_ptr + row * stride_pt + t // PAGE, mask=live, other=0).to(tl.int64)
            tok = page * (2 * PAGE * HKV * D) + ((t % PAGE) * HKV + h) * D
            # in q's dtype as they load: the cache may be stored narrower (float8)
            k = tl.load(cache_ptr + tok[:, None] + rd[None, :], mask=live[:, None], other=0.0).to(q.dtype)
            v = tl.load(cache_ptr + PAGE * HKV * D + tok[:, None] + rd[None, :], mask=live[:, None],
                        other=0.0).to(q.dtype)
            scores = tl.where(live[None, :], _scores(q, k, DOT) * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            p = tl.exp2(scores - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + _weighted(p, v, DOT)
            m_i = m_new
        if SPLITS == 1:
            dst = out_ptr + row * stride_or + (h * G + rg[:, None]) * stride_oh + rd[None, :]
            tl.store(dst, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=rg[:, None] < G)
        else:
            base = (row * HKV + h) * SPLITS
            head = rg < G
            active = tl.cdiv(blocks, per)  # the splits that hold blocks (the rest store nothing)
            if s < active:
                ml = pml_ptr + ((base + s) * 2) * G + rg  # m in log2 units, as the merge weighs it
                tl.store(ml, m_i, mask=head)
                tl.store(ml + G, l_i, mask=head)
                tl.store(po_ptr + ((base + s) * G + rg[:, None]) * D + rd[None, :], acc, mask=head[:, None])
            done = tl.atomic_add(counter_ptr + row * HKV + h, 1, sem="acq_rel")
            if done == SPLITS - 1:  # the last of this (row, head): every partial is visible
                _merge(po_ptr, pml_ptr, out_ptr, base, active, row, h, stride_or, stride_oh, G, D, SPLITS)
                tl.atomic_xchg(counter_ptr + row * HKV + h, 0, sem="relaxed")


def setting() -> str:
    """VOX_TRITON_DECODE: 1 (the default: where FlashInfer's decode runs on CUDA cores), all (every geometry, for
    A/B measurements against the tensor-core decode) or 0 (never)."""
    value = os.environ.get(ENV, "1").strip().lower() or "1"
    if value not in ("0", "1", "all"):
        raise ValueError(f"{ENV}={value!r}: use 1 (the default), all or 0")
    return value


def max_rows() -> int:
    """VOX_TRITON_DECODE_ROWS: the largest decode bucket served (MAX_ROWS unless set; a positive integer)."""
    value = os.environ.get(ROWS_ENV, "").strip()
    if not value:
        return MAX_ROWS
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{ROWS_ENV}={value!r}: use a positive number of rows (the default is {MAX_ROWS})")
    return int(value)


def serves_geometry(*, rows: int, q_heads: int, kv_heads: int, head_dim: int, page_size: int, tensor_cores: bool,
                    cuda: bool) -> bool:
    """Whether decode launches of `rows` rows of this geometry run here: CUDA, a power-of-two head dim, a page size
    that divides or is divided by the block, and either at most max_rows() rows as `setting()` says for a geometry
    whose FlashInfer decode would run on its tensor cores or not, or (VOX_TRITON_DECODE_ROWS unset) a bucket in
    WIDE_ROWS. Fixed per captured bucket (no tensor is read), so a backend may decide once per bucket whether
    its FlashInfer plan is ever read."""
    value = setting()
    if triton is None or not cuda or value == "0":
        return False
    if not (head_dim & (head_dim - 1) == 0 and q_heads % kv_heads == 0 and blocks_fit(page_size)):
        return False
    few = rows <= max_rows() and (not tensor_cores or value == "all")
    return few or (rows in WIDE_ROWS and not os.environ.get(ROWS_ENV, "").strip())

"""A depth transformer's one-position step (`layers/depth.DepthTransformer.step` with n == 1) as one persistent
Triton kernel at one row: the input projection, every layer and the head's float32 logits in one launch.

At one row the step is ~33 launches of a few microseconds each (Qwen3-TTS's code predictor: 5 layers of 1024, 14
such steps a frame), each paying its launch and its first loads' latency before its weights stream; the weights
it reads (~165 MB) would take ~35 us at the HBM's bandwidth. Here PROGRAMS programs (`settings.programs_per_sm`
per SM, or as many as the compiled kernel lets be resident) run the step's phases in order and wait for each
other between them on a grid barrier (an atomic counter in global memory, whose top bit flips at every barrier,
so it needs no reset between launches):

    in_proj (when it is a Linear) | per layer: qkv (residual add + RMSNorm folded in) | attention | o |
    gate/up (residual add + RMSNorm + SwiGLU folded in) | down | final norm + head

A projection phase is rt/small_gemm's column blocks (`small_gemm.column_block`, the FMA path: the same rounding
as the one-projection kernels), spread over the programs; the attention phase computes what rt/depth_attention
computes, one program per (row, query head) issuing all its loads at once (the new key and value used as they are
written to the cache). So the kernel computes what the unfused step with those kernels computes, up to the
projections' block sizes (summation order), and only the launches and the waits between them differ.

The programs must all be resident at once (a barrier waits for every one): PROGRAMS is bounded by the SMs times the
programs one SM holds (from the compiled kernel's registers, shared memory and warps), so an otherwise busy GPU
delays the barrier but cannot deadlock it.

`PHASE` >= 0 runs one phase and no barrier: the phases launched one after the other (`phased=True`) compute the
same, which is how Triton's interpreter (it runs programs one at a time, so a barrier could never be passed)
checks the kernel on the CPU. The layers' weights are stacked per kind ([layers, N, K]) at `prepare`, the
modules' parameters becoming views of the stacks, so nothing is copied twice.

Off unless `VOX_DEPTH_STEP=1`, and served for one row only: on an H200 (benchmark/results/h200-2026-12-03d,
`benchmark/depth_step.py`) the step at one row took 143-195 us against the unfused kernels' 126 us (CUDA graphs,
PDL) over six launch settings, the best at 4 programs per SM (the grid was bounded at 2 by residency); the barriers
(26 a step) and the attention phases' serial latency are the suspects, not measured apart. Triton's LLVM crashed
compiling it for 2-row blocks at Qwen3-TTS's sizes (an SLP vectorizer assertion), so more rows are not served.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vox_serve.rt import triton_ops

try:
    import triton
    import triton.language as tl

    from vox_serve.rt.depth_attention import _tile
    from vox_serve.rt.small_gemm import column_block
    from vox_serve.rt.triton_ops import _norm_rotate, _store_kv
except Exception:  # noqa: BLE001 - no Triton: the step's own kernels run
    triton = None

ENV = "VOX_DEPTH_STEP"
MAX_ROWS = 1  # the rows served (see the docstring: more did not compile at Qwen3-TTS's sizes)
forced: bool | None = None  # tests: True serves any tensors (CPU ones through Triton's interpreter), False none
phased: bool | None = None  # tests: the phases launched one by one (None: on the CPU only)
forced_programs: int | None = None  # tests: the program count (instead of one per SM)
forced_rows: int | None = None  # tests: the rows served, up to SCRATCH_ROWS (small sizes compile with 2-4)
SCRATCH_ROWS = 4  # the scratch rows allocated


def _on(t: Tensor) -> bool:
    return triton_ops.switched_on(t, forced, ENV, default_on=False)


@dataclass
class Stacked:
    """The layers' weights stacked per kind, and the step's scratch rows."""

    norm1: Tensor  # [L, H]
    qkv: Tensor  # [L, Hq * D + 2 * Hkv * D, H]
    q_norm: Tensor | None  # [L, D]
    k_norm: Tensor | None
    o: Tensor  # [L, H, Hq * D]
    norm2: Tensor  # [L, H]
    gate_up: Tensor  # [L, 2I, H]
    down: Tensor  # [L, H, I]
    streams: Tensor  # [2, SCRATCH_ROWS, H] the residual stream, alternating
    qkv_out: Tensor  # [SCRATCH_ROWS, Hq * D + 2 * Hkv * D]
    attn: Tensor  # [SCRATCH_ROWS, Hq * D]
    o_out: Tensor  # [SCRATCH_ROWS, H]
    act: Tensor  # [SCRATCH_ROWS, I]
    down_out: Tensor  # [SCRATCH_ROWS, H]
    barrier: Tensor  # [1] int32


def _stack(params: list[nn.Parameter]) -> Tensor:
    """The parameters stacked into one tensor, each parameter becoming a view of its slice."""
    stacked = torch.stack([p.detach() for p in params])
    for i, p in enumerate(params):
        p.data = stacked[i]
    return stacked


def prepare(depth: nn.Module) -> Stacked | None:
    """The stacks and scratch of a DepthTransformer whose step the kernel can serve, or None."""
    layers, c = depth.layers, depth.cfg
    w = depth.heads
    if triton is None or not _on(w) or not len(layers) or c.head_dim % 2:
        return None
    if not isinstance(depth.in_proj, (nn.Linear, nn.Identity)):
        return None
    if any(la.qkv_proj.weight.dtype != w.dtype for la in layers):  # float8 weights: the step's own kernels
        return None
    qk_norm = layers[0].qk_norm

    def rows(width: int) -> Tensor:
        return torch.zeros(SCRATCH_ROWS, width, dtype=w.dtype, device=w.device)

    qkv_width = sum(layers[0].split)
    return Stacked(
        norm1=_stack([la.input_layernorm.weight for la in layers]), qkv=_stack([la.qkv_proj.weight for la in layers]),
        q_norm=_stack([la.q_norm.weight for la in layers]) if qk_norm else None,
        k_norm=_stack([la.k_norm.weight for la in layers]) if qk_norm else None,
        o=_stack([la.o_proj.weight for la in layers]),
        norm2=_stack([la.post_attention_layernorm.weight for la in layers]),
        gate_up=_stack([la.gate_up_proj.weight for la in layers]),
        down=_stack([la.down_proj.weight for la in layers]),
        streams=torch.zeros(2, SCRATCH_ROWS, c.hidden_size, dtype=w.dtype, device=w.device), qkv_out=rows(qkv_width),
        attn=rows(c.num_heads * c.head_dim), o_out=rows(c.hidden_size), act=rows(c.intermediate_size),
        down_out=rows(c.hidden_size), barrier=torch.zeros(1, dtype=torch.int32, device=w.device))


@dataclass(frozen=True)
class Settings:
    """How the kernel is launched: programs per SM (fewer where the compiled kernel's registers or shared memory
    do not let that many be resident), warps per program, the float32 accumulator elements of a projection's column
    block (its K block follows), the largest column block, pipeline stages."""

    programs_per_sm: int = 4  # the best of benchmark/depth_step.py's settings on an H200 (2 were resident)
    warps: int = 4
    acc_elements: int = 8192
    max_block_n: int = 64
    stages: int = 2


settings = Settings()
_GRIDS: dict[tuple, int] = {}  # (device, settings, constexprs) -> the programs launched


def _blocks(n: int, k: int, rows: int, programs: int, gated: bool = False) -> dict[str, int]:
    """A projection phase's column and K blocks: about one column block per program, the accumulator bounded."""
    block_n = max(1, min(settings.max_block_n, triton.next_power_of_2(-(-n // programs))))
    budget = settings.acc_elements // (rows * block_n * (2 if gated else 1))
    return {"BLOCK_N": block_n, "BLOCK_K": max(16, min(triton.next_power_of_2(k), budget))}


def _resident(compiled: object, device: torch.device) -> int:
    """How many programs of a compiled kernel fit on one SM at once (registers, shared memory, warps)."""
    props = torch.cuda.get_device_properties(device)
    warps = compiled.metadata.num_warps
    regs_per_warp = -(-max(compiled.n_regs, 1) * 32 // 256) * 256
    by_regs = props.regs_per_multiprocessor // (regs_per_warp * warps)
    shared = compiled.metadata.shared
    by_shared = props.shared_memory_per_multiprocessor // shared if shared else 32
    by_warps = props.max_threads_per_multi_processor // (32 * warps)
    return max(0, min(by_regs, by_shared, by_warps, 32))


def _grid(args: tuple, consts: dict, device: torch.device, sms: int) -> int:
    """The programs of a persistent launch: settings.programs_per_sm per SM, bounded by what is resident (every
    program must be, or a barrier would wait for one that never starts)."""
    key = (device.index, settings, tuple(sorted(consts.items())))
    if key not in _GRIDS:
        compiled = _depth_step_kernel.warmup(*args, grid=(1,), **consts, PROGRAMS=sms, PHASE=-1,
                                             num_warps=settings.warps, num_stages=settings.stages)
        compiled._init_handles()  # loads it: n_regs
        per_sm = min(settings.programs_per_sm, _resident(compiled, device))
        if per_sm < 1:
            raise RuntimeError(f"rt.depth_step: not one program fits on an SM ({compiled.n_regs} registers, "
                               f"{compiled.metadata.shared} bytes of shared memory)")
        _GRIDS[key] = per_sm * sms
    return _GRIDS[key]


def run(depth: nn.Module, stacked: Stacked, x: Tensor, slots: Tensor, positions: Tensor, head: int) -> Tensor | None:
    """x [B, input width] at one position per row (positions [B], cache slots [B]) -> float32 logits [B, vocab]
    through head `head`; None where the kernel does not serve (more than MAX_ROWS rows, switched off)."""
    b = x.shape[0]
    if b == 0 or b > (forced_rows or MAX_ROWS) or not _on(x):
        return None
    c, layers = depth.cfg, depth.layers
    linear_in = isinstance(depth.in_proj, nn.Linear)
    x = x.contiguous()
    out = torch.empty(b, c.vocab_size, dtype=torch.float32, device=x.device)
    rope = depth.rope
    in_w = depth.in_proj.weight if linear_in else x
    in_b = depth.in_proj.bias if linear_in and depth.in_proj.bias is not None else x
    qn = stacked.q_norm if stacked.q_norm is not None else stacked.norm1
    kn = stacked.k_norm if stacked.k_norm is not None else stacked.norm1
    args = (x, in_w, in_b, stacked.norm1, stacked.qkv, qn, kn, stacked.o, stacked.norm2, stacked.gate_up,
            stacked.down, depth.norm.weight, depth.heads[head], depth.k_cache, depth.v_cache, slots, positions,
            rope.cos, rope.sin, stacked.streams[0], stacked.streams[1], stacked.qkv_out, stacked.attn,
            stacked.o_out, stacked.act, stacked.down_out, out, stacked.barrier, b, c.rms_norm_eps,
            rope.cos.stride(0), c.head_dim ** -0.5)
    sms = forced_programs or torch.cuda.get_device_properties(x.device).multi_processor_count
    consts = _constexprs(depth, stacked, x.shape[1], b, sms * (1 if forced_programs else settings.programs_per_sm))
    one_by_one = not x.is_cuda if phased is None else phased
    if one_by_one:
        for phase in range(int(linear_in) + 5 * len(layers) + 1):
            _depth_step_kernel[(sms,)](*args, **consts, PROGRAMS=sms, PHASE=phase, num_warps=settings.warps,
                                       num_stages=settings.stages)
        return out
    programs = _grid(args, consts, x.device, sms)
    _depth_step_kernel[(programs,)](*args, **consts, PROGRAMS=programs, PHASE=-1, num_warps=settings.warps,
                                    num_stages=settings.stages)
    return out


def _constexprs(depth: nn.Module, stacked: Stacked, width: int, rows: int, target: int) -> dict[str, int | bool]:
    """The kernel's sizes and, per projection phase, blocks for about `target` programs."""
    c = depth.cfg
    linear_in = isinstance(depth.in_proj, nn.Linear)
    bucket = 1 << max(rows - 1, 0).bit_length()
    h, i_size, qkv_n = c.hidden_size, c.intermediate_size, stacked.qkv.shape[1]
    blocks = {
        "IN": _blocks(h, width, bucket, target), "QKV": _blocks(qkv_n, h, bucket, target),
        "O": _blocks(h, c.num_heads * c.head_dim, bucket, target),
        "GU": _blocks(i_size, h, bucket, target, gated=True), "DOWN": _blocks(h, i_size, bucket, target),
        "HEAD": _blocks(c.vocab_size, h, bucket, target)}
    return {f"{name}_{k}": v for name, d in blocks.items() for k, v in d.items()} | dict(
        IN_K=width, LINEAR_IN=linear_in, IN_BIAS=linear_in and depth.in_proj.bias is not None, H=h, QKV_N=qkv_n,
        Q_HEADS=c.num_heads, HKV=c.num_kv_heads, HALF=c.head_dim // 2,
        HALF_BLOCK=triton.next_power_of_2(c.head_dim // 2), I_SIZE=i_size, V=c.vocab_size, LAYERS=len(depth.layers),
        CACHE_LAYER=depth.k_cache[0].numel(), POSITIONS=depth.num_positions,
        P_PAD=triton.next_power_of_2(depth.num_positions), HAS_NORM=depth.layers[0].qk_norm, BLOCK_M=bucket)


if triton is not None:

    @triton.jit
    def _grid_sync(bar_ptr, PROGRAMS: tl.constexpr):
        """Every program's writes so far visible to every program: each adds to the counter (program 0 so that
        the PROGRAMS additions flip its top bit and leave the rest), then waits for the flip."""
        tl.debug_barrier()  # the program's threads have all written
        add = tl.where(tl.program_id(0) == 0, 2147483648 - (PROGRAMS - 1), 1).to(tl.int32)
        old = tl.atomic_add(bar_ptr, add, sem="release", scope="gpu")
        now = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        while (old ^ now) >= 0:  # the top bit has not flipped yet
            now = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()

    @triton.jit
    def _projection(pid, x_ptr, d_ptr, nw_ptr, sum_ptr, w_ptr, b_ptr, out_ptr, m, N, eps, K: tl.constexpr,
                    HAS_DELTA: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, HAS_BIAS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROGRAMS: tl.constexpr):
        """A projection phase: program pid's column blocks pid, pid + PROGRAMS, ..."""
        for blk in range(pid, tl.cdiv(N, BLOCK_N), PROGRAMS):
            column_block(blk, x_ptr, d_ptr, nw_ptr, sum_ptr, w_ptr, b_ptr, b_ptr, out_ptr, m, N, eps, K, HAS_DELTA,
                         NORM, GATED, False, HAS_BIAS, False, False, False, BLOCK_M, BLOCK_N, BLOCK_K)

    @triton.jit
    def _phase_end(bar_ptr, PHASE: tl.constexpr, PROGRAMS: tl.constexpr):
        """Persistent (PHASE < 0): the grid barrier between two phases; one phase per launch: nothing."""
        if PHASE < 0:
            _grid_sync(bar_ptr, PROGRAMS)

    @triton.jit
    def _attend_query(r, qh, qkv_ptr, out_ptr, kc_ptr, vc_ptr, slot_ptr, pos_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr,
                      table_stride, scale, eps, QKV_N: tl.constexpr, Q_HEADS: tl.constexpr, HKV: tl.constexpr,
                      POSITIONS: tl.constexpr, P_PAD: tl.constexpr, HAS_NORM: tl.constexpr, HALF: tl.constexpr,
                      BLOCK: tl.constexpr):
        """Row r's query head qh at its one new position, from the qkv rows: depth_attention's arithmetic, but all
        its loads at once. The new key (prepared and rounded as the cache holds it) and value are used as loaded, the
        cache's own slot for that position masked out of the tile; the group's first query head writes them."""
        r = r.to(tl.int64)
        h = qh // (Q_HEADS // HKV)
        d = tl.arange(0, BLOCK)
        dmask = d < HALF
        dtype = qkv_ptr.dtype.element_ty
        row = qkv_ptr + r * QKV_N
        pos = tl.load(pos_ptr + r).to(tl.int64)
        cos = tl.load(cos_ptr + pos * table_stride + d, mask=dmask, other=0.0)
        sin = tl.load(sin_ptr + pos * table_stride + d, mask=dmask, other=0.0)
        k_new1, k_new2 = _norm_rotate(row + (Q_HEADS + h) * (2 * HALF), kw_ptr, cos, sin, d, dmask, eps, HAS_NORM,
                                      HALF)
        k_new1, k_new2 = k_new1.to(dtype), k_new2.to(dtype)
        v_src = row + (Q_HEADS + HKV + h) * (2 * HALF)
        p = tl.arange(0, P_PAD)
        new = (p == pos)[:, None]
        tile_mask = ((p < POSITIONS) & (p != pos))[:, None] & dmask[None, :]
        at = r * (POSITIONS * HKV * 2 * HALF) + h * (2 * HALF) + p.to(tl.int64) * (HKV * 2 * HALF)
        k1, k2 = _tile(kc_ptr, at, d, tile_mask, HALF)
        v1, v2 = _tile(vc_ptr, at, d, tile_mask, HALF)
        k1 = tl.where(new, k_new1.to(tl.float32)[None, :], k1)
        k2 = tl.where(new, k_new2.to(tl.float32)[None, :], k2)
        v1 = tl.where(new, tl.load(v_src + d, mask=dmask, other=0.0).to(tl.float32)[None, :], v1)
        v2 = tl.where(new, tl.load(v_src + HALF + d, mask=dmask, other=0.0).to(tl.float32)[None, :], v2)
        y1, y2 = _norm_rotate(row + qh * (2 * HALF), qw_ptr, cos, sin, d, dmask, eps, HAS_NORM, HALF)
        y1 = y1.to(dtype).to(tl.float32)  # as the rotated q that the unfused path keeps
        y2 = y2.to(dtype).to(tl.float32)
        s = tl.sum(k1 * y1[None, :], axis=1) + tl.sum(k2 * y2[None, :], axis=1)
        s = tl.where(p <= pos, s * scale, float("-inf"))  # past the query: another frame's positions
        e = tl.exp(s - tl.max(s, axis=0))
        inv = 1.0 / tl.sum(e, axis=0)
        dst = out_ptr + (r * Q_HEADS + qh) * (2 * HALF)
        tl.store(dst + d, (tl.sum(e[:, None] * v1, axis=0) * inv).to(out_ptr.dtype.element_ty), mask=dmask)
        tl.store(dst + HALF + d, (tl.sum(e[:, None] * v2, axis=0) * inv).to(out_ptr.dtype.element_ty), mask=dmask)
        if qh % (Q_HEADS // HKV) == 0:  # the cache's copy, read by the next steps
            _store_kv(kc_ptr, vc_ptr, slot_ptr, v_src, r, h, k_new1, k_new2, d, dmask, POSITIONS,
                      POSITIONS * HKV * 2 * HALF, HKV * 2 * HALF, 2 * HALF, HALF, False)  # (model-dtype cache)

    @triton.jit
    def _layer(pid, layer, x0, n1_ptr, qkv_w, qn_ptr, kn_ptr, o_w, n2_ptr, gu_w, down_w, kc_ptr, vc_ptr, slot_ptr,
               pos_ptr, cos_ptr, sin_ptr, s0_ptr, s1_ptr, qkv_ptr, att_ptr, o_ptr, act_ptr, dn_ptr, bar_ptr, m, eps,
               table_stride, scale, FIRST: tl.constexpr, LINEAR_IN: tl.constexpr, H: tl.constexpr,
               QKV_N: tl.constexpr, Q_HEADS: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
               HALF_BLOCK: tl.constexpr, I_SIZE: tl.constexpr, CACHE_LAYER: tl.constexpr, POSITIONS: tl.constexpr,
               P_PAD: tl.constexpr, HAS_NORM: tl.constexpr, BLOCK_M: tl.constexpr, PROGRAMS: tl.constexpr,
               PHASE: tl.constexpr, QKV_BLOCK_N: tl.constexpr, QKV_BLOCK_K: tl.constexpr, O_BLOCK_N: tl.constexpr,
               O_BLOCK_K: tl.constexpr, GU_BLOCK_N: tl.constexpr, GU_BLOCK_K: tl.constexpr,
               DOWN_BLOCK_N: tl.constexpr, DOWN_BLOCK_K: tl.constexpr):
        """Layer `layer`'s five phases (numbered from LINEAR_IN + 5 * layer), its weights and caches at the stacks'
        layer offsets; FIRST: layer 0, whose input is x0 with nothing added."""
        D: tl.constexpr = 2 * HALF
        QD: tl.constexpr = Q_HEADS * D
        base = LINEAR_IN + 5 * layer
        n1_ptr += layer * H
        qkv_w += layer * (QKV_N * H)
        qn_ptr += layer * D
        kn_ptr += layer * D
        o_w += layer * (H * QD)
        n2_ptr += layer * H
        gu_w += layer * (2 * I_SIZE * H)
        down_w += layer * (H * I_SIZE)
        kc_ptr += layer * CACHE_LAYER
        vc_ptr += layer * CACHE_LAYER
        if FIRST:  # x0, nothing added
            src, delta, has_delta = x0, x0, False
        else:
            src, delta, has_delta = s1_ptr, dn_ptr, True
        if PHASE < 0 or PHASE == base:  # qkv of RMSNorm(stream + down), the sum written
            _projection(pid, src, delta, n1_ptr, s0_ptr, qkv_w, x0, qkv_ptr, m, QKV_N, eps, H, has_delta, True, False,
                        False, BLOCK_M, QKV_BLOCK_N, QKV_BLOCK_K, PROGRAMS)
            _phase_end(bar_ptr, PHASE, PROGRAMS)
        if PHASE < 0 or PHASE == base + 1:  # attention: the (row, query head) pairs
            for pair in range(pid, m * Q_HEADS, PROGRAMS):
                item = pid * 0 + pair  # a tensor (the interpreter's loop counter is an int)
                _attend_query(item // Q_HEADS, item % Q_HEADS, qkv_ptr, att_ptr, kc_ptr, vc_ptr, slot_ptr, pos_ptr,
                              cos_ptr, sin_ptr, qn_ptr, kn_ptr, table_stride, scale, eps, QKV_N, Q_HEADS, HKV,
                              POSITIONS, P_PAD, HAS_NORM, HALF, HALF_BLOCK)
            _phase_end(bar_ptr, PHASE, PROGRAMS)
        if PHASE < 0 or PHASE == base + 2:  # o
            _projection(pid, att_ptr, att_ptr, att_ptr, att_ptr, o_w, att_ptr, o_ptr, m, H, eps, QD, False, False,
                        False, False, BLOCK_M, O_BLOCK_N, O_BLOCK_K, PROGRAMS)
            _phase_end(bar_ptr, PHASE, PROGRAMS)
        if FIRST:
            stream = x0
        else:
            stream = s0_ptr
        if PHASE < 0 or PHASE == base + 3:  # silu(gate) * up of RMSNorm(stream + o), the sum written
            _projection(pid, stream, o_ptr, n2_ptr, s1_ptr, gu_w, x0, act_ptr, m, I_SIZE, eps, H, True, True, True,
                        False, BLOCK_M, GU_BLOCK_N, GU_BLOCK_K, PROGRAMS)
            _phase_end(bar_ptr, PHASE, PROGRAMS)
        if PHASE < 0 or PHASE == base + 4:  # down
            _projection(pid, act_ptr, act_ptr, act_ptr, act_ptr, down_w, act_ptr, dn_ptr, m, H, eps, I_SIZE, False,
                        False, False, False, BLOCK_M, DOWN_BLOCK_N, DOWN_BLOCK_K, PROGRAMS)
            _phase_end(bar_ptr, PHASE, PROGRAMS)

    @triton.jit(do_not_specialize=["m", "eps", "table_stride", "scale"])
    def _depth_step_kernel(x_ptr, in_w, in_b, n1_ptr, qkv_w, qn_ptr, kn_ptr, o_w, n2_ptr, gu_w, down_w, fn_ptr,
                           head_w, kc_ptr, vc_ptr, slot_ptr, pos_ptr, cos_ptr, sin_ptr, s0_ptr, s1_ptr, qkv_ptr,
                           att_ptr, o_ptr, act_ptr, dn_ptr, out_ptr, bar_ptr, m, eps, table_stride, scale,
                           IN_K: tl.constexpr, LINEAR_IN: tl.constexpr, IN_BIAS: tl.constexpr, H: tl.constexpr,
                           QKV_N: tl.constexpr, Q_HEADS: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
                           HALF_BLOCK: tl.constexpr, I_SIZE: tl.constexpr, V: tl.constexpr, LAYERS: tl.constexpr,
                           CACHE_LAYER: tl.constexpr, POSITIONS: tl.constexpr, P_PAD: tl.constexpr,
                           HAS_NORM: tl.constexpr, BLOCK_M: tl.constexpr, PROGRAMS: tl.constexpr,
                           PHASE: tl.constexpr, IN_BLOCK_N: tl.constexpr, IN_BLOCK_K: tl.constexpr,
                           QKV_BLOCK_N: tl.constexpr, QKV_BLOCK_K: tl.constexpr, O_BLOCK_N: tl.constexpr,
                           O_BLOCK_K: tl.constexpr, GU_BLOCK_N: tl.constexpr, GU_BLOCK_K: tl.constexpr,
                           DOWN_BLOCK_N: tl.constexpr, DOWN_BLOCK_K: tl.constexpr, HEAD_BLOCK_N: tl.constexpr,
                           HEAD_BLOCK_K: tl.constexpr):
        pid = tl.program_id(0)
        # The residual stream: x0 is the input after in_proj (streams[0]), or the input itself. Layer 0's qkv
        # phase adds nothing; every later sum alternates: a layer's qkv phase reads streams[1] (+ down) and writes
        # streams[0], its gate/up phase reads streams[0] (layer 0: x0) (+ o) and writes streams[1], and the head
        # reads streams[1] (+ down).
        if LINEAR_IN:
            x0 = s0_ptr
            if PHASE < 0 or PHASE == 0:
                _projection(pid, x_ptr, x_ptr, x_ptr, x_ptr, in_w, in_b, s0_ptr, m, H, eps, IN_K, False, False, False,
                            IN_BIAS, BLOCK_M, IN_BLOCK_N, IN_BLOCK_K, PROGRAMS)
                _phase_end(bar_ptr, PHASE, PROGRAMS)
        else:
            x0 = x_ptr
        # layer 0 (nothing added to x0 before its qkv), then the others in a loop (one copy of their code)
        _layer(pid, 0, x0, n1_ptr, qkv_w, qn_ptr, kn_ptr, o_w, n2_ptr, gu_w, down_w, kc_ptr, vc_ptr, slot_ptr, pos_ptr,
               cos_ptr, sin_ptr, s0_ptr, s1_ptr, qkv_ptr, att_ptr, o_ptr, act_ptr, dn_ptr, bar_ptr, m, eps,
               table_stride, scale, True, LINEAR_IN, H, QKV_N, Q_HEADS, HKV, HALF, HALF_BLOCK, I_SIZE, CACHE_LAYER,
               POSITIONS, P_PAD, HAS_NORM, BLOCK_M, PROGRAMS, PHASE, QKV_BLOCK_N, QKV_BLOCK_K, O_BLOCK_N, O_BLOCK_K,
               GU_BLOCK_N, GU_BLOCK_K, DOWN_BLOCK_N, DOWN_BLOCK_K)
        for layer in range(1, LAYERS):
            _layer(pid, layer, x0, n1_ptr, qkv_w, qn_ptr, kn_ptr, o_w, n2_ptr, gu_w, down_w, kc_ptr, vc_ptr, slot_ptr,
                   pos_ptr, cos_ptr, sin_ptr, s0_ptr, s1_ptr, qkv_ptr, att_ptr, o_ptr, act_ptr, dn_ptr, bar_ptr, m, eps,
                   table_stride, scale, False, LINEAR_IN, H, QKV_N, Q_HEADS, HKV, HALF, HALF_BLOCK, I_SIZE,
                   CACHE_LAYER, POSITIONS, P_PAD, HAS_NORM, BLOCK_M, PROGRAMS, PHASE, QKV_BLOCK_N, QKV_BLOCK_K,
                   O_BLOCK_N, O_BLOCK_K, GU_BLOCK_N, GU_BLOCK_K, DOWN_BLOCK_N, DOWN_BLOCK_K)
        if PHASE < 0 or PHASE == LINEAR_IN + 5 * LAYERS:  # the final norm of stream + down through the head
            _projection(pid, s1_ptr, dn_ptr, fn_ptr, s0_ptr, head_w, x_ptr, out_ptr, m, V, eps, H, True, True, False,
                        False, BLOCK_M, HEAD_BLOCK_N, HEAD_BLOCK_K, PROGRAMS)

"""A small decoder stack run through a prefill and a decode step with padded rows, over the paged torch backend,
and a small depth transformer over two sub-steps: for comparing the fused kernels (Triton) against the reference
path (tests/triton_checks/check_ops.py under the interpreter, tests/test_gpu_kernels.py on a GPU)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from vox_serve.layers.decoder import DecoderDims, DecoderLayer, RMSNorm, paged_attend, run_layers
from vox_serve.layers.depth import DepthTransformer
from vox_serve.layers.fp8 import PROJECTIONS, quantize_decoder_layers
from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.rt import fp8_gemm
from vox_serve.rt.attention import AttentionBuffers, AttentionPlan, PlanInputs, TorchAttentionBackend

DIMS = DecoderDims(vocab_size=50, hidden_size=96, intermediate_size=160, num_layers=3, num_heads=4, num_kv_heads=2,
                   head_dim=32, rms_norm_eps=1e-6)
PAGE_SIZE, NUM_PAGES, PAGES_PER_SEQ = 4, 12, 4
ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def _randomize(module: nn.Module, seed: int) -> None:
    """Every weight random (norm weights around 1, so the norms are not the identity)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.3 * noise if "norm" in name else noise / p.shape[-1] ** 0.5)


def paged_stack_outputs(qk_norm: bool, dtype: torch.dtype, device: str, weights: str = "model") -> list[Tensor]:
    """[prefill hidden states [14, hidden], decode hidden states of the 2 real rows, the KV caches but the null
    page]: 2 sequences (5 and 9 tokens) prefilled, then one decode step over 4 rows, 2 of them padded.
    `weights`: "fp8" quantizes the projections (layers/fp8), "dequantized" gives them the values those float8
    weights stand for, in `dtype`."""
    d = DIMS
    layers = nn.ModuleList(DecoderLayer(d.hidden_size, d.intermediate_size, d.num_heads, d.num_kv_heads, d.head_dim,
                                        d.rms_norm_eps, i, qk_norm=qk_norm) for i in range(d.num_layers))
    norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
    stack = nn.ModuleList([layers, norm])
    _randomize(stack, seed=int(qk_norm))
    stack.to(device=device, dtype=dtype)
    _set_weights(layers, weights)
    rope = RotaryEmbedding(d.head_dim, 64, ROPE).to(device)
    backend = TorchAttentionBackend(num_layers=d.num_layers, num_pages=NUM_PAGES, page_size=PAGE_SIZE,
                                    num_q_heads=d.num_heads, num_kv_heads=d.num_kv_heads, head_dim=d.head_dim,
                                    dtype=dtype, device=device)
    pages = torch.tensor([[1, 2, 6, 0], [3, 4, 5, 7], [0, 0, 0, 0], [0, 0, 0, 0]])  # rows 2, 3: padded
    gen = torch.Generator().manual_seed(5)
    outs = []
    for qo_lens, kv_lens, rows in (([5, 9], [5, 9], 2), ([1, 1, 1, 1], [6, 10, 1, 1], 4)):
        positions = torch.cat([torch.arange(kv - qo, kv) for qo, kv in zip(qo_lens, kv_lens, strict=True)])
        seq = torch.repeat_interleave(torch.arange(rows), torch.tensor(qo_lens))
        slots = pages[seq, positions // PAGE_SIZE] * PAGE_SIZE + positions % PAGE_SIZE  # padded rows: slot 0
        indptr = torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)
        bufs = AttentionBuffers(page_table=pages[:rows].int().to(device),
                                kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=device),
                                qo_indptr=indptr.to(device), slot_mapping=slots.to(device))
        plan = AttentionPlan(num_seqs=rows, qo_lens=qo_lens, kv_lens=kv_lens, decode=max(qo_lens) == 1)
        backend.plan(plan, PlanInputs(None, None, None, None, max_pages_per_seq=PAGES_PER_SEQ))
        x = torch.randn(len(positions), d.hidden_size, generator=gen).to(device=device, dtype=dtype)
        with torch.no_grad():
            hidden = norm(*run_layers(layers, x, positions.to(device), rope, paged_attend(backend, bufs)))
        outs.append(hidden[:2] if plan.decode else hidden)
    return [*outs, *(cache[1:] for cache in backend.kv_caches)]


def _set_weights(layers: nn.ModuleList, weights: str) -> None:
    if weights == "fp8":
        quantize_decoder_layers(layers)
    elif weights == "dequantized":
        with torch.no_grad():
            for layer in layers:
                for name in PROJECTIONS:
                    w = getattr(layer, name).weight
                    w.copy_(fp8_gemm.dequantize_weight(*fp8_gemm.quantize_weight(w), w.dtype))


def depth_outputs(qk_norm: bool, dtype: torch.dtype, device: str) -> list[Tensor]:
    """The float32 logits of two depth steps over 3 rows (positions 0-1, then 2) and the static KV caches."""
    depth = DepthTransformer(dims=DIMS, in_proj=nn.Identity(), num_positions=4, num_heads_out=3, rope=ROPE,
                             qk_norm=qk_norm)
    _randomize(depth, seed=10 + int(qk_norm))
    depth.to(device=device, dtype=dtype)
    depth.allocate(max_rows=3)
    gen = torch.Generator().manual_seed(6)
    x0, x1 = (torch.randn(3, n, DIMS.hidden_size, generator=gen).to(device=device, dtype=dtype) for n in (2, 1))
    with torch.no_grad():
        logits = [depth.step(x0, start=0, head=0), depth.step(x1, start=2, head=1)]
    return [*logits, depth.k_cache[:, :, :3], depth.v_cache[:, :, :3]]


def stack_outputs(kind: str, qk_norm: bool, dtype: torch.dtype, device: str) -> list[Tensor]:
    return (paged_stack_outputs if kind == "paged" else depth_outputs)(qk_norm, dtype, device)


def relative_errors(got: list[Tensor], ref: list[Tensor]) -> list[float]:
    """||got - ref|| / ||ref|| per output."""
    return [((g.float() - r.float()).norm() / r.float().norm()).item() for g, r in zip(got, ref, strict=True)]


def depth_step_outputs(linear_in: bool, qk_norm: bool, rows: int, dtype: torch.dtype, device: str,
                       one_kernel: bool, phased: bool | None = None) -> list[Tensor]:
    """Two frames of three depth steps over `rows` rows (positions 0-1, then 2, then 3: the last two one position
    each) of a depth transformer with an input projection (a biased Linear from a wider input) or none: their
    float32 logits and the static KV caches; `one_kernel` serves the one-position steps with rt/depth_step's
    kernel (`phased`: its phases launched one by one; by default on the CPU only)."""
    from vox_serve.rt import depth_step

    width = DIMS.hidden_size + 16 if linear_in else DIMS.hidden_size
    in_proj = nn.Linear(width, DIMS.hidden_size, bias=True) if linear_in else nn.Identity()
    depth = DepthTransformer(dims=DIMS, in_proj=in_proj, num_positions=5, num_heads_out=4, rope=ROPE, qk_norm=qk_norm)
    _randomize(depth, seed=20 + int(qk_norm) + 2 * int(linear_in))
    depth.to(device=device, dtype=dtype)
    forced, was_phased = depth_step.forced, depth_step.phased
    depth_step.forced, depth_step.phased, depth_step.forced_rows = one_kernel, phased, rows
    try:
        depth.allocate(max_rows=4)
        assert (depth._stacked is not None) == one_kernel
        gen = torch.Generator().manual_seed(7)
        logits = []
        for _ in range(2):  # the second frame's steps find the first's keys and values past their positions
            xs = [torch.randn(rows, n, width, generator=gen).to(device=device, dtype=dtype) for n in (2, 1, 1)]
            with torch.no_grad():
                logits += [depth.step(x, start=start, head=i)
                           for i, (x, start) in enumerate(zip(xs, (0, 2, 3), strict=True))]
    finally:
        depth_step.forced, depth_step.phased, depth_step.forced_rows = forced, was_phased, None
    return [*logits, depth.k_cache[:, :rows, :4], depth.v_cache[:, :rows, :4]]

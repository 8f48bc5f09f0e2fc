"""Run under TRITON_INTERPRET=1 (tests/test_triton_ops.py): the fused kernels against their references."""

import os
import sys

import torch
import torch.nn.functional as F

from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.rt import codec_kernels, fp8_gemm, implicit_gemm, kernels, small_gemm, triton_ops
from vox_serve.rt.fp8_gemm import GemmConfig


def check_hash() -> None:
    seed = torch.tensor([0, 1, -5, 2**40 + 3, -(2**50)], dtype=torch.int64)
    offset = torch.tensor([0, 7, 2**33, -1, 12345], dtype=torch.int64)
    for n, salt in ((1, kernels._SALT_NORMAL_RADIUS), (37, kernels._SALT_UNIFORM), (4097, kernels._SALT_NORMAL_ANGLE)):
        ref = kernels._bits_to_uniform(kernels._hash_bits(seed, offset, n, salt))
        got = triton_ops.hash_uniform(seed, offset, n, salt)
        assert torch.equal(ref, got), (n, (ref - got).abs().max())


def _snake64(x: torch.Tensor, alpha: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.double() + scale.double() * torch.sin(alpha.double() * x.double()).pow(2)


def _assert_float32_close(got: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor, scale: torch.Tensor) -> None:
    """Snake in float32 against its float64 value: within 16 units of float32 rounding of the terms' sizes
    (each library's sin is a few units off, and CPUs differ); a wrong formula is off by orders more."""
    error = (got.double() - _snake64(x, alpha, scale)).abs()
    bound = 16 * torch.finfo(torch.float32).eps * (1 + x.double().abs() + scale.double())
    worst = int(error.argmax())
    assert bool((error <= bound).all()), f"off by {error.max().item():.3g}, bound {bound.flatten()[worst].item():.3g}"


def check_snake() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 700, generator=gen) * 3
    alpha = torch.rand(1, 3, 1, generator=gen) + 0.2
    scale = (alpha + 1e-9).reciprocal()
    _assert_float32_close(codec_kernels.snake(x, alpha, scale), x, alpha, scale)
    got16 = codec_kernels.snake(x.bfloat16(), alpha, scale)
    assert got16.dtype == torch.bfloat16 and (got16.double() - _snake64(x, alpha, scale)).abs().max() < 0.1
    # a strided input (a slice along time, as a transposed convolution's output is cut) and a left context
    wide = torch.randn(2, 3, 720, generator=gen)
    context = torch.randn(2, 3, 18, generator=gen)
    part = wide[..., 5:705]
    joined = codec_kernels.snake(part, alpha, scale, context=context)
    assert joined.shape == (2, 3, 718)
    _assert_float32_close(joined[..., 18:], part, alpha, scale)
    assert torch.equal(joined[..., :18], context)  # the context is copied exactly
    short = codec_kernels.snake(x[..., :5], alpha, scale, context=context[..., :6])  # rows shorter than a block
    _assert_float32_close(short[..., 6:], x[..., :5], alpha, scale)
    assert torch.equal(short[..., :6], context[..., :6])
    bias = torch.randn(3, generator=gen)  # a convolution's bias, added in the kernel
    shifted = part + bias[:, None]
    _assert_float32_close(codec_kernels.snake(part, alpha, scale, bias=bias), shifted, alpha, scale)
    y = torch.randn(2, 3, 700, generator=gen)
    triton_ops.enabled = lambda t: True  # add_residual takes the kernel only where it is enabled
    assert (codec_kernels.add_residual(part, y, bias) - (part + (y + bias[:, None]))).abs().max() < 1e-6


def check_rope() -> None:
    gen = torch.Generator().manual_seed(1)
    rope = RotaryEmbedding(16, 64, {"rope_type": "default", "rope_theta": 10000.0})
    qkv = torch.randn(5, (4 + 2 + 2) * 16, generator=gen)
    q, k = qkv[:, :64].view(5, 4, 16), qkv[:, 64:96].view(5, 2, 16)  # strided views, as the layers pass them
    positions = torch.tensor([0, 3, 9, 63, 1])
    ref_q, ref_k = rope(q, k, positions)
    assert (triton_ops.rope(q, rope.cos, rope.sin, positions) - ref_q).abs().max() < 1e-5
    assert (triton_ops.rope(k, rope.cos, rope.sin, positions) - ref_k).abs().max() < 1e-5


def check_silu_mul() -> None:
    gen = torch.Generator().manual_seed(3)
    gate_up = torch.randn(5, 2 * 300, generator=gen) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    ref = torch.nn.functional.silu(gate) * up
    assert (triton_ops.silu_mul(gate_up) - ref).abs().max() < 1e-5
    got16 = triton_ops.silu_mul(gate_up.bfloat16())
    assert got16.dtype == torch.bfloat16 and ((got16.float() - ref).abs() <= 0.02 * ref.abs() + 0.02).all()


def check_add_rms_norm() -> None:
    from vox_serve.layers.decoder import RMSNorm

    gen = torch.Generator().manual_seed(4)
    norm = RMSNorm(200, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(200, generator=gen) + 0.5)
    x, delta = torch.randn(3, 200, generator=gen), torch.randn(3, 200, generator=gen)
    total, out = triton_ops.add_rms_norm(x, delta, norm.weight, norm.eps)
    with torch.no_grad():
        assert torch.equal(total, x + delta) and (out - norm(x + delta)).abs().max() < 1e-5
        x16, d16, w16 = x.bfloat16(), delta.bfloat16(), norm.weight.detach().bfloat16()
        total16, out16 = triton_ops.add_rms_norm(x16, d16, w16, norm.eps)
        s16 = x16 + d16
        ref16 = (s16.float() * torch.rsqrt(s16.float().pow(2).mean(-1, keepdim=True) + norm.eps) * w16.float())
    # bf16 sums within one unit in the last place (the interpreter's float32 -> bf16 cast may truncate)
    assert total16.dtype == out16.dtype == torch.bfloat16
    assert ((total16.float() - s16.float()).abs() <= s16.float().abs() * 2**-7 + 1e-30).all()
    assert (out16.float() - ref16).abs().max() < 0.05


def check_rope_write_kv() -> None:
    """Rotation (with and without per-head norms) and the K/V write into a paged cache and a static one, float32
    and bf16, strided q/k/v, GQA, several pages, padded rows on the null page, a head dim whose half is not a
    power of two."""
    for dtype in (torch.float32, torch.bfloat16):
        for dim, qk_norm in ((16, False), (16, True), (24, True)):
            _check_rope_write_kv(dtype, dim, qk_norm)
        _check_kv_write_only(dtype)


def _qkv_case(dtype: torch.dtype, dim: int, tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Strided q [T, 4, D], k, v [T, 2, D] views of one fused qkv output, as the layers pass them."""
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(tokens, 8 * dim, generator=gen) * 2).to(dtype)
    return qkv[:, : 4 * dim].view(tokens, 4, dim), qkv[:, 4 * dim : 6 * dim].view(tokens, 2, dim), \
        qkv[:, 6 * dim :].view(tokens, 2, dim)


def _reference_prep(q: torch.Tensor, k: torch.Tensor, rope: RotaryEmbedding, positions: torch.Tensor,
                    norms: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused GPU path: F.rms_norm per head (weight applied in float32, then rounded), then rope."""
    if norms is not None:
        q = torch.nn.functional.rms_norm(q, (q.shape[-1],), norms[0].to(q.dtype), 1e-6)
        k = torch.nn.functional.rms_norm(k, (k.shape[-1],), norms[1].to(k.dtype), 1e-6)
    return rope(q, k, positions)


def _assert_close(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """float32: within 1e-5; bf16: within two units in the last place of each head's largest value (the normed
    head is rounded before its rotation, and the interpreter's float32 -> bf16 cast may truncate)."""
    assert got.dtype == ref.dtype, what
    scale = ref.float().abs().amax(-1, keepdim=True)
    bound = 1e-5 * (1 + scale) if got.dtype == torch.float32 else 2**-6 * scale
    err = ((got.float() - ref.float()).abs() - bound).max()
    assert err <= 0, (what, got.dtype, err)


def _check_rope_write_kv(dtype: torch.dtype, dim: int, qk_norm: bool) -> None:
    from vox_serve.rt.attention.kv_write import QKPrep, write_kv

    page_size, num_pages, tokens = 4, 6, 7
    q, k, v = _qkv_case(dtype, dim, tokens, seed=dim + qk_norm)
    rope = RotaryEmbedding(dim, 64, {"rope_type": "default", "rope_theta": 10000.0})
    positions = torch.tensor([0, 3, 9, 63, 1, 0, 0])
    slots = torch.tensor([5, 6, 17, 22, 4, 0, 0])  # pages 1, 4, 5; the last two rows padded (the null page)
    gen = torch.Generator().manual_seed(7)
    norms = (torch.rand(dim, generator=gen) + 0.5, torch.rand(dim, generator=gen) + 0.5) if qk_norm else None
    ref_q, ref_k = _reference_prep(q, k, rope, positions, norms)
    cache = torch.full((num_pages, 2, page_size, 2, dim), 7.0, dtype=dtype)  # what is not written stays 7
    args = dict(q_norm=norms[0].to(dtype), k_norm=norms[1].to(dtype), eps=1e-6) if qk_norm else {}
    got_q = triton_ops.rope_write_kv(q, k, v, cache[:, 0], cache[:, 1], slots, cos=rope.cos, sin=rope.sin,
                                     positions=positions, **args)
    assert got_q.shape == q.shape and got_q.is_contiguous()
    _assert_close(got_q, ref_q, "q")
    ref_cache = torch.full_like(cache, 7.0)
    page, offset = slots // page_size, slots % page_size
    ref_cache[page, 0, offset], ref_cache[page, 1, offset] = ref_k, v
    _assert_close(cache[1:], ref_cache[1:], "k/v cache")
    assert torch.equal(cache[1:, 1], ref_cache[1:, 1]), "v is copied exactly"
    if not qk_norm:  # the CPU path of write_kv (the layers' own rope) gives the same cache and q
        cpu_cache = torch.full_like(cache, 7.0)
        cpu_q = write_kv(cpu_cache[:, 0], cpu_cache[:, 1], q, k, v, slots, QKPrep(rope=rope, positions=positions))
        _assert_close(got_q, cpu_q, "q vs write_kv")
        _assert_close(cache[1:], cpu_cache[1:], "cache vs write_kv")
    # A depth transformer's static cache: separate K and V tensors [rows, positions, Hkv, D], rows as pages.
    k_static, v_static = torch.zeros(3, 8, 2, dim, dtype=dtype), torch.zeros(3, 8, 2, dim, dtype=dtype)
    rows = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    static_pos = torch.tensor([1, 2, 1, 2, 5, 6, 7])
    got_q = triton_ops.rope_write_kv(q, k, v, k_static, v_static, rows * 8 + static_pos, cos=rope.cos,
                                     sin=rope.sin, positions=static_pos, **args)
    ref_q, ref_k = _reference_prep(q, k, rope, static_pos, norms)
    _assert_close(got_q, ref_q, "q (static)")
    _assert_close(k_static[rows, static_pos], ref_k, "k (static)")
    assert torch.equal(v_static[rows, static_pos], v) and k_static[:, 0].abs().max() == 0


def _check_kv_write_only(dtype: torch.dtype) -> None:
    """No rope (the caller rotated, e.g. Zonos): k and v land unchanged and q comes back as it was."""
    q, k, v = _qkv_case(dtype, 16, 5, seed=11)
    cache = torch.zeros(4, 2, 4, 2, 16, dtype=dtype)
    slots = torch.tensor([4, 5, 13, 0, 0])
    assert triton_ops.rope_write_kv(q, k, v, cache[:, 0], cache[:, 1], slots) is q
    ref = torch.zeros_like(cache)
    ref[slots // 4, 0, slots % 4], ref[slots // 4, 1, slots % 4] = k, v
    assert torch.equal(cache[1:], ref[1:]), "k and v at their slots, nothing else written"


def check_depth_attention(device: str = "cpu") -> None:
    """rt.depth_attention (a depth transformer's q/k preparation, cache write and attention in one kernel)
    against the PyTorch path: q/k prepared with and without per-head norms, written at each row's positions of a
    static cache whose other positions hold stale values, causal attention over the row's positions; one and
    two new positions per row, 1 and 3 rows, GQA groups 2 and 4 and none; float32 and bf16 (also run on a GPU by
    tests/test_gpu_kernels.py, the reference there too)."""
    from vox_serve.rt import depth_attention

    depth_attention.forced = True
    try:
        for dtype in (torch.float32, torch.bfloat16):
            for i, (qk_norm, rows, n, start, hq, hkv) in enumerate(
                    ((True, 1, 2, 0, 4, 2), (True, 3, 1, 5, 4, 2), (False, 3, 2, 0, 8, 2), (False, 2, 1, 16, 2, 2))):
                _check_depth_attention(dtype, qk_norm, rows, n, start, hq, hkv, seed=i, device=device)
    finally:
        depth_attention.forced = False


def _check_depth_attention(dtype: torch.dtype, qk_norm: bool, rows: int, n: int, start: int, hq: int, hkv: int,
                           seed: int, device: str) -> None:
    from vox_serve.rt import depth_attention

    dim, num_positions, max_rows = 16, 17, 4
    gen = torch.Generator().manual_seed(seed)
    tokens = rows * n
    qkv = (torch.randn(tokens, (hq + 2 * hkv) * dim, generator=gen) * 2).to(dtype).to(device)
    q = qkv[:, : hq * dim].view(tokens, hq, dim)
    k = qkv[:, hq * dim : (hq + hkv) * dim].view(tokens, hkv, dim)
    v = qkv[:, (hq + hkv) * dim :].view(tokens, hkv, dim)
    rope = RotaryEmbedding(dim, num_positions, {"rope_type": "default", "rope_theta": 10000.0}).to(device)
    positions = (start + torch.arange(n)).repeat(rows).to(device)
    norms = (torch.rand(dim, generator=gen).to(device) + 0.5, torch.rand(dim, generator=gen).to(device) + 0.5) \
        if qk_norm else None
    # stale values and this frame's earlier positions
    k_cache = torch.randn(max_rows, num_positions, hkv, dim, generator=gen).to(dtype).to(device)
    v_cache = torch.randn(max_rows, num_positions, hkv, dim, generator=gen).to(dtype).to(device)
    ref_k_cache, ref_v_cache = k_cache.clone(), v_cache.clone()
    args = dict(q_norm=norms[0].to(dtype), k_norm=norms[1].to(dtype), eps=1e-6) if qk_norm else {}
    row = torch.arange(rows, device=device).repeat_interleave(n)
    slots = row * num_positions + positions
    got = depth_attention.attend(q, k, v, k_cache, v_cache, slots, positions, rows=rows, cos=rope.cos, sin=rope.sin,
                                 **args)
    # The unfused GPU path's preparation and write (rope_write_kv, itself checked against PyTorch above): the
    # same roundings, so the caches agree exactly and the attention within its summation order.
    ref_q = triton_ops.rope_write_kv(q, k, v, ref_k_cache, ref_v_cache, slots,
                                     cos=rope.cos, sin=rope.sin, positions=positions, **args)
    what = (dtype, qk_norm, rows, n, start, hq, hkv)
    assert torch.equal(k_cache, ref_k_cache) and torch.equal(v_cache, ref_v_cache), what  # nothing else touched
    if dtype == torch.float32:  # and against PyTorch's own preparation
        _assert_close(ref_q, _reference_prep(q, k, rope, positions, norms)[0], f"q {what}")
    group = hq // hkv
    ref = torch.empty(tokens, hq, dim, device=device)
    for t in range(tokens):
        visible = int(positions[t]) + 1
        keys = ref_k_cache[row[t], :visible].float().repeat_interleave(group, dim=1)  # [visible, Hq, D]
        values = ref_v_cache[row[t], :visible].float().repeat_interleave(group, dim=1)
        probs = torch.softmax(torch.einsum("hd,phd->hp", ref_q[t].float(), keys) * dim ** -0.5, dim=-1)
        ref[t] = torch.einsum("hp,phd->hd", probs, values)
    assert got is not None and got.shape == q.shape, what
    _assert_close(got.cpu(), ref.to(dtype).cpu(), f"attention {what}")


def check_decoder_stack() -> None:
    """The decoder layers with the fused kernels (run here by the interpreter) against the reference path: a paged
    stack (prefill, then decode with padded rows) and a depth transformer, with and without per-head q/k norms."""
    from tests.decoder_stack_helpers import relative_errors, stack_outputs
    from vox_serve.rt import depth_attention

    configs = (None, small_gemm.BlockConfig(16, 32), small_gemm.BlockConfig(16, 32, dot=True))
    for kind in ("paged", "depth"):
        for qk_norm in (False, True):
            ref = stack_outputs(kind, qk_norm, torch.float32, "cpu")
            # the projections unfused, then through rt.small_gemm's two paths, then with the gate/up projection
            # unfused (its gate in the down projection's kernel)
            for config, skip in (*((c, None) for c in configs), (configs[1], small_gemm.Kind.GATED)):
                enabled, triton_ops.enabled = triton_ops.enabled, lambda t: True
                small_gemm.forced = None if config is None else (
                    lambda kind, m, n, k, c=config, skip=skip: None if kind is skip else c)
                depth_attention.forced = config is not None  # a depth step's attention in one kernel too
                try:
                    got = stack_outputs(kind, qk_norm, torch.float32, "cpu")
                finally:
                    triton_ops.enabled, small_gemm.forced, depth_attention.forced = enabled, None, False
                errors = relative_errors(got, ref)
                assert max(errors) < 1e-5, (kind, qk_norm, config, errors)


def check_depth_step(device: str = "cpu") -> None:
    """rt.depth_step (a depth transformer's one-position step in one kernel; here its phases launched one by one)
    against the step's own kernels (small_gemm and depth_attention, which it is made of, with their own blocks):
    with and without an input projection and per-head q/k norms, 1-4 rows, float32 (also run on a GPU by
    tests/test_gpu_kernels.py, persistent there)."""
    from tests.decoder_stack_helpers import depth_step_outputs, relative_errors
    from vox_serve.rt import depth_attention, depth_step

    enabled, triton_ops.enabled = triton_ops.enabled, lambda t: True
    small_gemm.forced = lambda kind, m, n, k: small_gemm.BlockConfig(16, 32)
    depth_attention.forced = True
    depth_step.forced_programs = 3  # the phases' column blocks strided over the programs
    try:
        for linear_in, qk_norm, rows in ((True, True, 1), (False, True, 3), (True, False, 4), (False, False, 2)):
            ref = depth_step_outputs(linear_in, qk_norm, rows, torch.float32, device, one_kernel=False)
            got = depth_step_outputs(linear_in, qk_norm, rows, torch.float32, device, one_kernel=True)
            errors = relative_errors(got, ref)
            assert max(errors) < 1e-5, (linear_in, qk_norm, rows, errors)
            assert torch.equal(got[0], ref[0])  # the two-position step is not the kernel's: the same path
    finally:
        triton_ops.enabled, small_gemm.forced, depth_attention.forced = enabled, None, False
        depth_step.forced_programs = None


def _small_gemm_reference(kind: "small_gemm.Kind", x: torch.Tensor, delta: torch.Tensor | None, norm_w: torch.Tensor,
                          w: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused ops, rounded as they are: the sum, the normed rows, the projections, then the gate."""
    total = x if delta is None else (x.float() + delta.float()).to(x.dtype)
    if kind in (small_gemm.Kind.PLAIN, small_gemm.Kind.GATED_IN):
        a = total
        if kind is small_gemm.Kind.GATED_IN:  # the gate first, rounded as silu_mul's output
            gate, up = x.float().chunk(2, dim=-1)
            a = (torch.nn.functional.silu(gate) * up).to(x.dtype)
        y = a.float() @ w.float().t() + (0 if bias is None else bias.float())
        return total, y.to(x.dtype)
    s = total.float()
    h = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w.float()).to(x.dtype)
    y = (h.float() @ w.float().t()).to(x.dtype)
    if kind is small_gemm.Kind.GATED:
        gate, up = y.float().chunk(2, dim=-1)
        y = (torch.nn.functional.silu(gate) * up).to(x.dtype)
    return total, y


def check_small_gemm(device: str = "cpu", fp8: bool = False) -> None:
    """Every kind (plain and gated-input with and without bias, norm and gated with and without the residual
    delta), on the
    FMA and the tensor-core paths, their K loops pipelined or unrolled, rows 1..16, N and K not multiples of the
    blocks, float32 and bfloat16 (also run on a GPU by tests/test_gpu_kernels.py); the reference on the CPU.
    `fp8`: the weights quantized to float8 with their per-row scales (`--quantization fp8`), against the reference
    over the dequantized weights (float32)."""
    from types import SimpleNamespace

    gen = torch.Generator().manual_seed(8)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 0.04)):  # bf16: a few roundings
        for config in (small_gemm.BlockConfig(8, 64), small_gemm.BlockConfig(16, 32, dot=True),
                       small_gemm.BlockConfig(4, 32, unroll=True),
                       small_gemm.BlockConfig(32, 64, dot=True, unroll=True)):
            if dtype == torch.bfloat16 and config.dot and device == "cpu":
                continue  # the interpreter's bfloat16 tl.dot is wrong (Triton 3.9); the GPU tier checks this one
            small_gemm.forced = lambda kind, m, n, k, c=config: c
            for m in (1, 3, 16):
                for kind in small_gemm.Kind:
                    for with_extra in (False, True):
                        n, k = 40, 100
                        plain = kind in (small_gemm.Kind.PLAIN, small_gemm.Kind.GATED_IN)
                        width = 2 * k if kind is small_gemm.Kind.GATED_IN else k  # its input: gate and up
                        x = (torch.randn(m, width, generator=gen) * (2 if width > k else 1)).to(dtype)
                        extra = torch.randn(n if plain else m, k, generator=gen)
                        w = (torch.randn(2 * n if kind is small_gemm.Kind.GATED else n, k, generator=gen) / 8).to(dtype)
                        w, scale, w_ref = _weights(w, fp8, device)
                        norm = SimpleNamespace(weight=(torch.rand(k, generator=gen) + 0.5).to(dtype), eps=1e-6)
                        dev = SimpleNamespace(weight=norm.weight.to(device), eps=norm.eps)
                        if plain:
                            bias = extra[0, :n].to(dtype) if with_extra else None
                            bias_dev = None if bias is None else bias.to(device)
                            fn = small_gemm.gated_linear if kind is small_gemm.Kind.GATED_IN else small_gemm.linear
                            got = fn(x.to(device), w, bias_dev, scale=scale)
                            total = x
                            ref = _small_gemm_reference(kind, x, None, norm.weight, w_ref, bias)
                        else:
                            delta = extra.to(dtype) if with_extra else None
                            fn = small_gemm.norm_gated if kind is small_gemm.Kind.GATED else small_gemm.norm_linear
                            delta_dev = None if delta is None else delta.to(device)
                            total, got = fn(x.to(device), delta_dev, dev, w, scale=scale)
                            ref = _small_gemm_reference(kind, x, delta, norm.weight, w_ref, None)
                            if kind is small_gemm.Kind.NORM:  # logits stored as float32: the output, widened
                                wide = fn(x.to(device), delta_dev, dev, w, out_dtype=torch.float32, scale=scale)[1]
                                assert wide.dtype == torch.float32 and torch.equal(wide, got.float())
                        total, got = total.cpu(), got.cpu()
                        what = (dtype, config, m, kind, with_extra)
                        assert got.shape == ref[1].shape and got.dtype == dtype, what
                        assert (total.float() - ref[0].float()).abs().max() <= tol * 4, what
                        err = ((got.float() - ref[1].float()).abs() / (ref[1].float().abs() + 1)).max()
                        # a GPU's tensor cores take float32 as TF32 (10-bit mantissa)
                        # (TF32 rounds both operands to 11 significant bits: the H200 gave 2.2e-3 for the
                        # gated form, a product of two such sums; bfloat16 serves, float32 only in tests)
                        bound = 5e-3 if dtype == torch.float32 and config.dot and device != "cpu" else tol
                        assert err < bound, (what, err)
    small_gemm.forced = None


def _weights(w: torch.Tensor, fp8: bool, device: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(the weight on `device`, its float8 scales or None, the weight the reference multiplies by)."""
    if not fp8:
        return w.to(device), None, w
    wq, scale = fp8_gemm.quantize_weight(w)
    return wq.to(device), scale.to(device), fp8_gemm.dequantize_weight(wq, scale, torch.float32)


def check_small_gemm_fp8(device: str = "cpu") -> None:
    check_small_gemm(device, fp8=True)


def _e4m3_tie(v: torch.Tensor) -> torch.Tensor:
    """Where v lies halfway between two float8 e4m3 values (3 mantissa bits; normal range)."""
    steps = v.abs() * torch.exp2(3 - torch.floor(torch.log2(v.abs().clamp_min(2**-6))))
    return steps - torch.floor(steps) == 0.5


def check_quantize_rows(device: str = "cpu") -> None:
    """The rows' float8 quantization kernel against the torch ops (zero rows and rows wider than a block too)."""
    gen = torch.Generator().manual_seed(11)
    for dtype in (torch.float32, torch.bfloat16):
        for m, k in ((1, 100), (5, 3072), (3, 8192)):
            x = (torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 10).to(dtype)
            x[-1] = 0 if m > 2 else x[-1]
            ref_q, ref_s = fp8_gemm.quantize_rows(x)  # a CPU tensor with interpret off: the torch ops
            fp8_gemm.interpret = True
            try:
                got_q, got_s = fp8_gemm.quantize_rows(x.to(device))
            finally:
                fp8_gemm.interpret = False
            assert got_q.dtype == fp8_gemm.FP8 and got_s.shape == (m, 1), (got_q.dtype, got_s.shape)
            assert torch.equal(got_s.cpu(), ref_s), (dtype, m, k, (got_s.cpu() - ref_s).abs().max())
            ref, got = ref_q.float(), got_q.cpu().float()
            if device == "cpu":  # Triton 3.9's interpreter rounds to float8 wrongly at ties (away from zero), where
                # the rounding carries into the next power of two, and at subnormals (a GPU converts in hardware:
                # compared everywhere)
                exact = (ref.abs() >= 2**-6) & (torch.frexp(ref)[0].abs() != 0.5) & ~_e4m3_tie(x.float() / ref_s)
                ref, got = ref[exact], got[exact]
            assert torch.equal(got, ref), (dtype, m, k, (got != ref).sum())


def check_quantized_inputs(device: str = "cpu") -> None:
    """add_rms_norm_fp8 and silu_mul_fp8 (one launch each) store the bits of their unfused forms: add_rms_norm,
    resp. silu_mul, then quantize_rows (rows of 1, 5 and 2 tokens, widths under and over a block, a zero row)."""
    gen = torch.Generator().manual_seed(13)
    fp8_gemm.interpret = device == "cpu"
    try:
        for dtype in (torch.float32, torch.bfloat16):
            for m, k in ((1, 100), (5, 3072), (2, 8192)):
                x, delta = (torch.randn(m, k, generator=gen).to(dtype).to(device) for _ in range(2))
                delta[-1] = -x[-1] if m > 1 else delta[-1]  # a row that sums to zero
                weight = (torch.rand(k, generator=gen) + 0.5).to(dtype).to(device)
                total, h = triton_ops.add_rms_norm(x, delta, weight, 1e-5)
                got = triton_ops.add_rms_norm_fp8(x, delta, weight, 1e-5)
                _same_quantized(got[1:], fp8_gemm.quantize_rows(h), (dtype, m, k, "norm"))
                assert torch.equal(got[0], total)
                gate_up = (torch.randn(m, 2 * k, generator=gen) * 4).to(dtype).to(device)
                got = triton_ops.silu_mul_fp8(gate_up)
                _same_quantized(got, fp8_gemm.quantize_rows(triton_ops.silu_mul(gate_up)), (dtype, m, k, "gate"))
    finally:
        fp8_gemm.interpret = False


def check_scaled_mm(device: str = "cpu") -> None:
    """rt/fp8_gemm's Triton float8 GEMM (a forced configuration) against the product of its two dequantized
    operands in float32, rounded to bfloat16: rows and columns past a tile's end, K not a multiple of the K block,
    a bias. cuBLASLt's GEMM is held to the same bound where the device runs it."""
    gen = torch.Generator().manual_seed(17)
    cases = ((37, 48, 96, GemmConfig(16, 16, 32)), (5, 80, 160, GemmConfig(16, 32, 64, stages=2)))
    if device == "cuda":
        cases += ((200, 3072, 3072, GemmConfig(64, 128, 128)), (256, 5120, 3072, GemmConfig(128, 64, 256, warps=8)),
                  (17, 2064, 8192, GemmConfig(64, 64, 128, stages=5)), (256, 3072, 8192 - 64, GemmConfig(64, 128, 256)),
                  (2, 1024, 2048, GemmConfig(16, 64, 512, stages=3)), (13, 2048, 6144, GemmConfig(16, 32, 256)))
    fp8_gemm.interpret = device == "cpu"
    try:
        for i, (m, n, k, config) in enumerate(cases):
            x = (torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen)).bfloat16().to(device)
            wq, scale = fp8_gemm.quantize_weight(torch.randn(n, k, generator=gen).to(device) / 20)
            bias = torch.randn(n, generator=gen).bfloat16().to(device) if i % 2 else None
            xq, x_scale = fp8_gemm.quantize_rows(x)
            want = (xq.float() * x_scale) @ fp8_gemm.dequantize_weight(wq, scale, torch.float32).T
            want = want + bias.float() if bias is not None else want
            fp8_gemm.forced = lambda m_, n_, k_, c=config: c
            try:
                got = fp8_gemm.scaled_mm(xq, x_scale, wq, scale, bias, torch.bfloat16)
            finally:
                fp8_gemm.forced = None
            row_size = want.abs().amax(dim=1, keepdim=True)
            assert got.dtype == torch.bfloat16 and got.shape == (m, n), (i, got.dtype, got.shape)
            assert bool(((got.float() - want).abs() <= 1e-2 * row_size).all()), (i, config)
            if device == "cuda":
                ref = fp8_gemm.scaled_mm(xq, x_scale, wq, scale, bias, torch.bfloat16)  # cuBLASLt's
                assert bool(((ref.float() - want).abs() <= 1e-2 * row_size).all()), i
    finally:
        fp8_gemm.interpret = False


def _same_quantized(got: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor], case) -> None:
    assert got[0].dtype == ref[0].dtype == fp8_gemm.FP8 and got[1].shape == ref[1].shape, case
    assert torch.equal(got[1], ref[1]) and torch.equal(got[0].float(), ref[0].float()), case


def check_depthwise() -> None:
    gen = torch.Generator().manual_seed(2)
    for dilation, padding, bias in ((1, 3, True), (3, 9, True), (9, 0, False)):
        conv = torch.nn.Conv1d(5, 5, 7, dilation=dilation, padding=padding, groups=5, bias=bias)
        x = torch.randn(2, 5, 300, generator=gen)
        with torch.no_grad():
            ref = conv(x)
            got = codec_kernels.depthwise_conv1d(x, conv.weight, conv.bias, dilation, padding)
        assert got.shape == ref.shape and (got - ref).abs().max() < 1e-5, (dilation, (got - ref).abs().max())
        alpha = torch.rand(1, 5, 1, generator=gen) + 0.2  # the Snake after it, in the same pass
        scale = (alpha + 1e-9).reciprocal()
        got = codec_kernels.depthwise_conv1d(x, conv.weight, conv.bias, dilation, padding, snake=(alpha, scale))
        _assert_float32_close(got, ref, alpha, scale)


def check_pointwise() -> None:
    """A 1x1 convolution with a residual add or SNAC's noise block in its epilogue: channel blocks and time
    blocks with a remainder, strided inputs (a cropped window), bias or none, in and out channels unequal."""
    gen = torch.Generator().manual_seed(12)
    for c_in, c_out, length, bias in ((64, 64, 300, True), (48, 16, 7, False), (128, 192, 129, True)):
        w = torch.randn(c_out, c_in, 1, generator=gen) / c_in**0.5
        b = torch.randn(c_out, generator=gen) if bias else None
        h = torch.randn(2, c_in, length + 4, generator=gen)[..., 3 : 3 + length]
        x = torch.randn(2, c_out, length, generator=gen)
        got = implicit_gemm.pointwise_conv1d(h, w, b, residual=x)
        ref = x + F.conv1d(h, w, b)
        assert got.shape == ref.shape and (got - ref).abs().max() < 1e-4, (c_in, (got - ref).abs().max())
        if c_in == c_out:
            noise = torch.randn(2, 1, length, generator=gen)
            got = implicit_gemm.pointwise_conv1d(h, w, None, residual=h, noise=noise)
            ref = h + noise * F.conv1d(h, w)
            assert (got - ref).abs().max() < 1e-4, (c_in, (got - ref).abs().max())
    tile = implicit_gemm.gemm_tile(96, 48, 1, 300, torch.bfloat16)
    assert (tile.co, tile.k) == (16, 32) and implicit_gemm.gemm_tile(64, 1024, 1, 9, torch.float32).k == 32
    assert implicit_gemm.gemm_tile(8, 64, 1, 300, torch.float32) is None


def check_conv_gemm() -> None:
    """A dense convolution as an implicit GEMM equals F.conv1d and its epilogues their formulas: taps of several
    dilations, padding on both sides, output channels not a multiple of the tile (masked), input channels of
    several blocks, strided inputs, lengths past one time tile, tiles given explicitly."""
    gen = torch.Generator().manual_seed(13)
    small = implicit_gemm.GemmTile(co=16, t=32, k=16)
    cases = ((32, 24, 7, 9, 0, 200, True, None), (48, 64, 7, 3, 3, 130, False, None), (16, 96, 3, 1, 1, 70, True, None),
             (64, 48, 7, 1, 0, 90, True, small), (32, 16, 1, 1, 0, 33, True, small))
    for c_in, c_out, kernel, dilation, padding, length, bias, tile in cases:
        conv = torch.nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding=padding, bias=bias)
        x = torch.randn(2, c_in, length + 5, generator=gen)[..., 2 : 2 + length]  # a strided view, as a cropped window
        taps = implicit_gemm.tap_weights(conv)
        with torch.no_grad():
            ref = conv(x)
            got = implicit_gemm.conv_gemm(x, taps, conv.bias, dilation, padding, tile=tile)
            assert got.shape == ref.shape and (got - ref).abs().max() < 1e-4, (c_in, c_out, (got - ref).abs().max())
            alpha, scale = torch.rand(c_out, generator=gen) + 0.2, torch.rand(c_out, generator=gen)
            res = torch.randn(*ref.shape, generator=gen)
            got = implicit_gemm.conv_gemm(x, taps, conv.bias, dilation, padding, snake=(alpha, scale), residual=res,
                                          tile=tile)
            want = _snake64(ref, alpha[:, None], scale[:, None]) + res
            assert (got - want).abs().max() < 1e-4, (c_in, c_out, "epilogue", (got - want).abs().max())
    for bad_tile, wrong in ((implicit_gemm.GemmTile(co=16, t=32, k=32), "tile's 32"), (None, "no multiple of 16")):
        x = torch.randn(1, 48 if bad_tile else 24, 40)
        try:
            implicit_gemm.conv_gemm(x, torch.randn(3, 16, x.shape[1]), None, tile=bad_tile)
            raise AssertionError("a tile that does not divide the channels must be refused")
        except ValueError as e:
            assert wrong in str(e), e
    conv = torch.nn.Conv1d(16, 16, 7)
    first = implicit_gemm.tap_weights(conv)
    assert implicit_gemm.tap_weights(conv) is first and first.shape == (7, 16, 16)
    with torch.no_grad():
        conv.weight.mul_(2.0)  # an in-place write: the taps follow it
    assert torch.equal(implicit_gemm.tap_weights(conv), conv.weight.permute(2, 0, 1))


def check_folded_conv() -> None:
    """A dilated convolution folded into its phases equals F.conv1d: lengths that are and are not a multiple of
    the dilation, with and without padding and bias, channels in != out."""
    gen = torch.Generator().manual_seed(9)
    for dilation, padding, length, bias in ((9, 0, 300, True), (9, 27, 301, False), (3, 0, 64, True), (2, 3, 7, True)):
        conv = torch.nn.Conv1d(6, 5, 7, dilation=dilation, padding=padding, bias=bias)
        x = torch.randn(3, 6, length + 6 * dilation - 2 * padding, generator=gen)
        with torch.no_grad():
            ref = conv(x)
            got = codec_kernels.folded_conv1d(x, conv.weight, conv.bias, dilation, padding)
        assert got.shape == ref.shape and (got - ref).abs().max() < 1e-5, (dilation, (got - ref).abs().max())


def check_transpose_gemm() -> None:
    """A transposed convolution as a GEMM and an overlap-add equals F.conv_transpose1d: SNAC's strides (kernel
    2 * stride, padding stride / 2), an odd stride with output padding, a kernel no multiple of the stride."""
    gen = torch.Generator().manual_seed(8)
    for stride, kernel, padding, output_padding, length in ((8, 16, 4, 0, 15), (2, 4, 1, 0, 9), (3, 6, 2, 1, 7),
                                                            (4, 7, 3, 2, 5), (5, 10, 3, 4, 1)):
        x = torch.randn(2, 6, length + 3, generator=gen)[..., 2 : 2 + length]  # strided, as a cropped window
        w, b = torch.randn(6, 5, kernel, generator=gen), torch.randn(5, generator=gen)
        ref = F.conv_transpose1d(x, w, b, stride=stride, padding=padding, output_padding=output_padding)
        got = codec_kernels.gemm_conv_transpose1d(x, w, b, stride, padding, output_padding)
        assert got.shape == ref.shape and (got - ref).abs().max() < 1e-4, (stride, (got - ref).abs().max())


def check_conv_to_one() -> None:
    """One output channel (a codec's last convolution): channels not a multiple of the block, strided input."""
    gen = torch.Generator().manual_seed(5)
    for channels, dilation, padding, bias in ((40, 1, 3, True), (96, 1, 0, True), (7, 3, 9, False)):
        conv = torch.nn.Conv1d(channels, 1, 7, dilation=dilation, padding=padding, bias=bias)
        x = torch.randn(2, channels, 310, generator=gen)[..., 3:303]
        with torch.no_grad():
            ref = conv(x)
            got = codec_kernels.conv1d_to_one(x, conv.weight, conv.bias, dilation, padding)
        assert got.shape == ref.shape and (got - ref).abs().max() < 1e-4, (channels, (got - ref).abs().max())


def check_codecs() -> None:
    """Whole tiny codecs with every codec kernel on (as on a GPU) equal the PyTorch path: the Qwen3-TTS codec
    streamed chunk by chunk (the fused Snake + left context of its causal convolutions) and SNAC."""
    from vox_serve.codecs.qwen3.decoder import Qwen3CodecConfig, Qwen3CodecDecoder
    from vox_serve.codecs.snac import SnacConfig, SnacDecoder, orpheus_frames_to_codes
    from vox_serve.models.orpheus.loader import SNAC_TINY_CONFIG
    from vox_serve.models.qwen3_tts.loader import TINY_CODEC_CONFIG

    wide = {**TINY_CODEC_CONFIG, "decoder_config": {**TINY_CODEC_CONFIG["decoder_config"], "decoder_dim": 256}}
    qwen = Qwen3CodecDecoder.random(Qwen3CodecConfig.from_dict(wide), seed=3)  # every residual unit 16+ channels:
    # its convolutions run as `conv_gemm` with the Snake and the residual add in their epilogues
    snac = SnacDecoder.random(SnacConfig.from_dict(SNAC_TINY_CONFIG), seed=5)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # random() zeroes these: non-zero Snake factors and biases, so every term counts
        for name, p in [*qwen.named_parameters(), *snac.named_parameters()]:
            if name.endswith(("alpha", "beta", "bias")):
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    codes = torch.randint(0, 2048, (2, 5, qwen.config.num_quantizers), generator=torch.Generator().manual_seed(4))
    frames = torch.randint(0, 4096, (2, 3, 7), generator=torch.Generator().manual_seed(6))
    seed = torch.tensor([11, 12])

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad():  # SNAC whole, and cropped to the middle frame (strided slices into the kernels)
            levels = orpheus_frames_to_codes(frames)
            return (qwen.decode(codes, max_chunk_frames=2), snac.decode(levels, seed),
                    snac.decode(levels, seed, keep=(2048, 4096)))

    refs = run()
    triton_ops.enabled = lambda t: True  # every kernel on, as for CUDA tensors
    os.environ["VOX_CODEC_TRANSPOSE_GEMM"] = "1"  # SNAC's transposed convolutions as GEMMs at 2 rows too
    for got, ref in zip(run(), refs, strict=True):
        assert got.shape == ref.shape and (got - ref).abs().max() < 1e-4, (got - ref).abs().max()


def check_sample() -> None:
    # The interpreter is slow on wide rows: 4097-wide rows (an 8192-entry sort) are left to the GPU tier.
    for rows, vocab in ((16, 300), (4, 2048)):
        _check_sample(rows, vocab)


def _check_sample(rows: int, vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[:, 7] = logits[:, 9]  # a tie: the lower id wins
    allowed = torch.rand(rows, vocab, generator=gen) > 0.2
    allowed[:, 0] = True
    params = kernels.SamplingTensors(
        temperature=torch.rand(rows, generator=gen) * 1.5, top_k=torch.randint(0, 60, (rows,), generator=gen),
        top_p=torch.rand(rows, generator=gen) * 0.5 + 0.5, min_p=torch.rand(rows, generator=gen) * 0.1,
        repetition_penalty=torch.ones(rows), seed=torch.randint(-2**40, 2**40, (rows,), generator=gen),
        offset=torch.randint(0, 10**6, (rows,), generator=gen))
    q = rows // 4
    params.temperature[:q] = 0.0  # greedy rows
    params.top_p[q : 2 * q] = 1.0
    params.top_k[2 * q : 3 * q] = 0
    ref = kernels.sample(logits, params, None, allowed)
    got = triton_ops.sample(logits, allowed, params.temperature, params.top_k, params.top_p, params.min_p,
                            params.seed, params.offset, kernels._SALT_UNIFORM)
    assert torch.equal(got[:q], ref[:q]), "greedy rows must agree exactly"
    agree = (got == ref).float().mean().item()
    assert agree >= 0.9, agree  # the rest: equal but for draws the last bits of exp() can tip
    print(f"vocab {vocab}: {agree:.3f} of draws equal the reference's")
    assert bool(allowed[torch.arange(rows), got].all()), "never a disallowed token"


def check_decode_rows(device: str = "cpu") -> None:
    """rt.launch_rows.decode_rows (a decode launch's per-row views in one kernel) against lm_batch's PyTorch code:
    every tensor of the LmBatch equal, dtypes included, over random slot tables: padded rows, positions inside the
    prompt and past it, absent and given ids in the code columns and an extra column, repetition windows shorter
    and longer than the launch's, with and without FlashInfer's page list."""
    from vox_serve.rt import launch_rows

    for n, window, pages in ((1, 5, True), (6, 5, True), (6, 0, False), (8, 3, True)):
        ref, got = (_decode_batch_outputs(_decode_source(n, window, pages, device), n, fused)
                    for fused in (False, True))
        for name, want in ref.items():
            assert got[name].dtype == want.dtype and torch.equal(got[name].cpu(), want.cpu()), (n, window, name)
    assert launch_rows.forced is None


def check_commit_rows(device: str = "cpu") -> None:
    """rt.launch_rows.commit against LmBatch.commit's PyTorch code: the same slot tables after committing random
    samples (audio, audio-stop and other kinds; padded rows all writing the scratch row, whose token and code
    entries then depend on the writers' order and are not compared; its code count is)."""
    from vox_serve.core.request import OutKind
    from vox_serve.rt import launch_rows
    from vox_serve.rt.lm_batch import LmSample, decode_batch

    for n in (1, 6, 8):
        tables = []
        for fused in (False, True):
            src = _decode_source(n, 3, True, device)
            batch = decode_batch(src, n)
            gen = torch.Generator().manual_seed(n)
            kinds = torch.tensor([int(k) for k in OutKind])[torch.randint(0, len(OutKind), (n,), generator=gen)]
            sample = LmSample(tokens=torch.randint(0, 99, (n, 2), generator=gen).to(device),
                              codes=torch.randint(0, 99, (n, 3), generator=gen).to(device), kind=kinds.to(device))
            launch_rows.forced = fused
            try:
                batch.commit(sample)
            finally:
                launch_rows.forced = None
            tables.append({name: t.cpu() for name, t in src.state.tables.items()}
                          | {"kind_out": batch.kind_out[:n].cpu()})
        scratch = src.state.scratch
        for name, want in tables[0].items():
            got = tables[1][name]
            if name in ("tokens", "codes"):
                got, want = got[:scratch], want[:scratch]
            assert torch.equal(got, want), (n, name)


def check_orpheus_step(device: str = "cpu") -> None:
    """models/orpheus/step_kernels against their PyTorch forms: the mapped repetition window equal, the stop logit
    set to -inf exactly where the reference's mask disallows it, the same draws without the mask as with it, and
    the emitted tokens, codes and kinds equal (candidates at the stop, codes of every slot)."""
    from vox_serve.models.orpheus import step_kernels as sk
    from vox_serve.rt import kernels

    gen = torch.Generator().manual_seed(7)
    for n, width in ((1, 64), (9, 64), (5, 0)):
        slot = torch.randint(0, 7, (n,), generator=gen)
        slot[0] = 0
        history = sk.AUDIO_START + torch.randint(-40, 7 * sk.CODES_PER_SLOT + 40, (n, width), generator=gen)
        history[torch.rand(n, width, generator=gen) < 0.2] = -1
        history[torch.rand(n, width, generator=gen) < 0.1] = sk.STOP_ID
        allow_stop = torch.rand(n, generator=gen) < 0.6
        logits = torch.randn(n, sk.CODES_PER_SLOT + 1, generator=gen) * 3
        logits[:, -1] += 4  # a likely stop, so a wrong mask shows in the draws
        params = kernels.SamplingTensors.filled(n, temperature=0.8, top_p=0.9, repetition_penalty=1.3)
        params.seed = torch.randint(0, 2**40, (n,), generator=gen)
        params.temperature[::4] = 0.0
        ref_local, allowed = sk.constrain_reference(history, slot, allow_stop)
        want = kernels.sample(logits, params, ref_local, allowed)
        got_logits = logits.clone().to(device)
        sk.forced = True
        try:
            local, mask = sk.constrain(got_logits, history.to(device), slot.to(device), allow_stop.to(device))
            cand = torch.randint(0, sk.CODES_PER_SLOT + 1, (n,), generator=gen)
            cand[::3] = sk.CODES_PER_SLOT
            emitted = sk.emit(cand.to(device), slot.to(device))
        finally:
            sk.forced = None
        assert mask is None and torch.equal(local.cpu(), ref_local), n  # the kernel ran: no mask for the draw
        assert torch.equal(got_logits.cpu(), torch.where(allowed, logits, float("-inf"))), n
        assert torch.equal(kernels.sample(got_logits.cpu(), params, local.cpu(), None), want), n
        for got_t, want_t in zip(emitted, sk.emit_reference(cand, slot), strict=True):
            assert got_t.dtype == want_t.dtype and torch.equal(got_t.cpu(), want_t), n

def _decode_source(n: int, window: int, with_pages: bool, device: str):  # noqa: ANN202 - an lm_batch.LaunchSource
    """A launch source of n decode rows over random slot tables (the same for the same arguments)."""
    from vox_serve.core.meta import EngineLimits, ProgramMeta, StopRule
    from vox_serve.core.plan import ABSENT_ID
    from vox_serve.rt import step_fields
    from vox_serve.rt.arena import Arena
    from vox_serve.rt.lm_batch import LaunchSource
    from vox_serve.rt.slot_state import SlotState

    meta = ProgramMeta(name="toy", sample_rate=1000, input_columns=3, codes_per_step=2, codes_per_frame=4,
                       samples_per_frame=100, frames_per_chunk=2, codec_lookback_frames=1, codec_lookahead_frames=1,
                       skip_leading_frames=0, max_model_len=64, max_text_chars=100,
                       stop_rule=StopRule(token=0, at_frame_boundary=True), default_sampling={},
                       accepted_fields=("text",))
    lim = EngineLimits(max_batch=8, max_prefill_tokens=64, max_prefill_seqs=4, max_codec_batch=8, frames_per_chunk=2,
                       num_pages=80, page_size=4, max_model_len=64, repetition_window=window)
    gen = torch.Generator().manual_seed(n * 10 + window)
    st = SlotState(meta, lim, torch.device(device))
    for t in st.tables.values():
        if t.dtype == torch.bool:
            t.copy_(torch.rand(t.shape, generator=gen) > 0.5)
        elif t.dtype.is_floating_point:
            t.copy_(torch.rand(t.shape, generator=gen))
        else:
            t.copy_(torch.randint(0, 50, t.shape, generator=gen))
    st["prompt_len"].copy_(torch.randint(1, 20, st["prompt_len"].shape, generator=gen))
    st["repetition_window"].copy_(torch.randint(0, window + 3, st["repetition_window"].shape, generator=gen))
    step_in = Arena("step_in", step_fields.step_input_fields(meta, lim), torch.device(device))
    step_out = Arena("step_out", step_fields.step_output_fields(meta, lim), torch.device(device))
    a = step_in.dev
    slots = torch.randperm(st.num_slots, generator=gen)[:n].int()
    slots[n // 2:][::2] = -1  # padded rows
    rows = st.slots(slots.long().to(device)).cpu()
    prompt = st["prompt_len"].cpu()[rows]
    pos = (prompt - 3 + torch.randint(0, 40, (n,), generator=gen)).clamp(min=0)  # some inside the prompt
    ids = torch.randint(0, 50, (n, 3), generator=gen).int()
    ids[:, :2][torch.rand(n, 2, generator=gen) > 0.4] = ABSENT_ID
    counts = (pos + 1 + lim.page_size - 1) // lim.page_size
    indptr = torch.zeros(n + 1, dtype=torch.int32)
    indptr[1:] = counts.cumsum(0)
    for name, value in (("decode_slot", slots), ("decode_pos", pos.int()), ("decode_ids", ids),
                        ("decode_kv_indptr", indptr)):
        a[name][: len(value)] = value.to(device)
    pages = torch.full((lim.max_batch * st.page_table.shape[1],), 777, dtype=torch.int32, device=device)
    return LaunchSource(st, step_in, step_out, lim.page_size, window, pages if with_pages else None)


def _decode_batch_outputs(src, n: int, fused: bool) -> dict:  # noqa: ANN001 - an lm_batch.LaunchSource
    import dataclasses

    from vox_serve.rt import launch_rows
    from vox_serve.rt.lm_batch import decode_batch

    launch_rows.forced = fused  # False: lm_batch's PyTorch path, on the GPU too
    try:
        batch = decode_batch(src, n)
    finally:
        launch_rows.forced = None
    out = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)
           if isinstance(getattr(batch, f.name), torch.Tensor)}
    out.update({f"attention.{f.name}": getattr(batch.attention, f.name) for f in dataclasses.fields(batch.attention)
                if isinstance(getattr(batch.attention, f.name), torch.Tensor) and not f.name.endswith("_host")})
    out.update({f"sampling.{f.name}": getattr(batch.sampling, f.name) for f in dataclasses.fields(batch.sampling)})
    out["kv_indices"] = src.kv_indices.clone() if src.kv_indices is not None else torch.zeros(0)
    return out

if __name__ == "__main__":
    globals()[f"check_{sys.argv[1]}"]()
    print("ok")

"""GPU tier: the compiled Triton kernels equal the PyTorch reference kernels (run on the CPU), and decoder stacks
with the kernels equal the same stacks on the reference path."""

from __future__ import annotations

import pytest
import torch
from decoder_stack_helpers import depth_step_outputs, paged_stack_outputs, relative_errors, stack_outputs
from sampling_helpers import random_case, to_cuda
from triton_checks.check_ops import (
    check_commit_rows,
    check_decode_rows,
    check_depth_attention,
    check_orpheus_step,
    check_quantize_rows,
    check_quantized_inputs,
    check_scaled_mm,
    check_small_gemm,
)

from vox_serve.layers.decoder import project
from vox_serve.layers.fp8 import Fp8Linear
from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.rt import codec_kernels, fp8_gemm, kernels, small_gemm, triton_ops

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or triton_ops.triton is None, reason="CUDA + Triton")]


def test_hash_uniforms_are_bit_identical() -> None:
    seed = torch.randint(-2**62, 2**62, (37,), dtype=torch.int64)
    offset = torch.randint(0, 2**40, (37,), dtype=torch.int64)
    ref = kernels.hash_uniform(seed, offset, 4097)
    assert torch.equal(triton_ops.hash_uniform(seed.cuda(), offset.cuda(), 4097, kernels._SALT_UNIFORM).cpu(), ref)


@pytest.mark.parametrize("vocab", [2048, 3072, 4097])
def test_fused_sampler_draws_the_reference_tokens(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits, allowed, history, params = random_case(256, vocab, gen)
    ref = kernels.sample(logits, params, history, allowed)
    penalised = kernels.apply_repetition_penalty(logits.cuda(), history.cuda(), params.repetition_penalty.cuda())
    cuda = to_cuda(params)
    # The Triton kernel itself (kernels.sample prefers the Rust extension's when it is built).
    got = triton_ops.sample(penalised, allowed.cuda(), cuda.temperature, cuda.top_k, cuda.top_p, cuda.min_p,
                            cuda.seed, cuda.offset, kernels._SALT_UNIFORM).cpu()
    assert torch.equal(got[:32], ref[:32])
    assert (got == ref).float().mean().item() >= 0.98


def test_codec_and_rope_kernels_match_the_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, 2000, generator=gen)
    alpha = torch.rand(1, 64, 1, generator=gen) + 0.2
    scale = (alpha + 1e-9).reciprocal()
    ref = x + scale * torch.sin(alpha * x).pow(2)
    assert (codec_kernels.snake(x.cuda(), alpha.cuda(), scale.cuda()).cpu() - ref).abs().max() < 1e-4
    context = torch.randn(4, 64, 54, generator=gen)
    joined = codec_kernels.snake(x.cuda()[..., 7:], alpha.cuda(), scale.cuda(), context=context.cuda()).cpu()
    assert torch.equal(joined[..., :54], context) and (joined[..., 54:] - ref[..., 7:]).abs().max() < 1e-4
    conv = torch.nn.Conv1d(64, 64, 7, dilation=3, padding=9, groups=64)
    last = torch.nn.Conv1d(64, 1, 7, padding=3)  # a codec's last convolution (cuDNN's generic GEMM was slow)
    with torch.no_grad():
        for c in (conv, last):
            ref = c(x)
            assert (codec_kernels.conv1d(c.cuda(), x.cuda()).cpu() - ref).abs().max() < 1e-4
    rope = RotaryEmbedding(128, 512, {"rope_type": "default", "rope_theta": 10000.0})
    q = torch.randn(33, 8, 128, generator=gen)
    positions = torch.randint(0, 512, (33,), generator=gen)
    ref_q, _ = rope(q, q, positions)
    got = triton_ops.rope(q.cuda(), rope.cos.cuda(), rope.sin.cuda(), positions.cuda()).cpu()
    assert (got - ref_q).abs().max() < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoder_layer_kernels_match_the_reference(dtype: torch.dtype) -> None:
    """silu_mul and add_rms_norm (the decoder layer's fused kernels on a GPU) at a 3B model's widths."""
    gen = torch.Generator().manual_seed(1)
    gate_up = (torch.randn(7, 2 * 8192, generator=gen) * 3).to(dtype)
    gate, up = gate_up.float().chunk(2, dim=-1)
    ref = torch.nn.functional.silu(gate) * up
    got = triton_ops.silu_mul(gate_up.cuda()).cpu().float()
    assert ((got - ref).abs() <= 1e-5 + (0.0 if dtype == torch.float32 else 1e-2) * ref.abs()).all()
    x, delta = (torch.randn(7, 3072, generator=gen).to(dtype) for _ in range(2))
    weight = (torch.rand(3072, generator=gen) + 0.5).to(dtype)
    total, out = triton_ops.add_rms_norm(x.cuda(), delta.cuda(), weight.cuda(), 1e-5)
    assert torch.equal(total.cpu(), x + delta)  # rounded to nearest as torch's own add
    s = (x + delta).float()
    ref = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    assert (out.cpu().float() - ref).abs().max() < (1e-4 if dtype == torch.float32 else 5e-2)


def _snr_db(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).mean() / (got - ref).pow(2).mean().clamp_min(1e-20)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codecs_on_cuda_equal_the_cpu_reference(dtype: torch.dtype) -> None:
    """The real-size Qwen3-TTS codec (streamed in chunks: the fused Snake + left context, the one-channel last
    convolution) and SNAC on a GPU, every codec kernel on, against PyTorch on the CPU in float32. cuDNN's
    float32 convolutions may use TF32, hence an SNR bound rather than an exact one."""
    from vox_serve.codecs.qwen3.decoder import Qwen3CodecConfig, Qwen3CodecDecoder
    from vox_serve.codecs.snac import SnacConfig, SnacDecoder, orpheus_frames_to_codes
    from vox_serve.models.orpheus.loader import SNAC_24KHZ_CONFIG

    floor = 45.0 if dtype == torch.float32 else 25.0
    qwen = Qwen3CodecDecoder.random(Qwen3CodecConfig(), seed=3)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in qwen.named_parameters():
            if name.endswith(("alpha", "beta", "bias")):
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    codes = torch.randint(0, qwen.config.codebook_size, (2, 6, qwen.config.num_quantizers), generator=gen)
    ref = qwen.decode(codes, max_chunk_frames=2)
    got = qwen.to("cuda", dtype).decode(codes.cuda(), max_chunk_frames=2).float().cpu()
    assert _snr_db(got, ref) >= floor, _snr_db(got, ref)
    snac = SnacDecoder.random(SnacConfig.from_dict(SNAC_24KHZ_CONFIG), seed=5)
    frames = torch.randint(0, 4096, (2, 7, 7), generator=gen)
    seed = torch.tensor([11, 12])
    with torch.no_grad():  # whole, and cropped to a streaming window's kept frame (Orpheus' default)
        ref = snac.decode(orpheus_frames_to_codes(frames), seed)
        kept = snac.decode(orpheus_frames_to_codes(frames), seed, keep=(2048, 4096))
        snac = snac.to("cuda", dtype)
        got = snac.decode(orpheus_frames_to_codes(frames.cuda()), seed.cuda()).float().cpu()
        got_kept = snac.decode(orpheus_frames_to_codes(frames.cuda()), seed.cuda(), keep=(2048, 4096)).float().cpu()
    snac_floor = 45.0 if dtype == torch.float32 else 30.0  # the stated bfloat16 tolerance (tests/test_snac_codec.py)
    assert _snr_db(got, ref) >= snac_floor, _snr_db(got, ref)
    assert _snr_db(got_kept, kept) >= snac_floor, _snr_db(got_kept, kept)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_write_kv_matches_the_reference(dtype: torch.dtype, qk_norm: bool) -> None:
    """At a 3B model's head shapes (24 q heads, 8 KV heads, dim 128; Qwen3's per-head norms when qk_norm):
    q and k rotated, k and v written at their slots of a paged cache, padded rows on the null page only."""
    gen = torch.Generator().manual_seed(2 + qk_norm)
    tokens, dim, page_size = 37, 128, 16
    qkv = (torch.randn(tokens, (24 + 16) * dim, generator=gen) * 2).to(dtype)
    q, k, v = qkv[:, : 24 * dim].view(tokens, 24, dim), qkv[:, 24 * dim : 32 * dim].view(tokens, 8, dim), \
        qkv[:, 32 * dim :].view(tokens, 8, dim)
    rope = RotaryEmbedding(dim, 1024, {"rope_type": "default", "rope_theta": 500000.0})
    positions = torch.randint(0, 1024, (tokens,), generator=gen)
    slots = torch.randperm(31 * page_size, generator=gen)[:tokens] + page_size  # pages 1..31, scattered
    slots[-5:] = 0  # padded rows
    weights = [(torch.rand(dim, generator=gen) + 0.5).to(dtype) for _ in range(2)]
    ref_q, ref_k = q, k
    if qk_norm:  # the unfused GPU path's norm: F.rms_norm (float32 math, the weight applied before the cast)
        ref_q, ref_k = (torch.nn.functional.rms_norm(x, (dim,), w, 1e-6) for x, w in ((q, weights[0]), (k, weights[1])))
    ref_q, ref_k = rope(ref_q, ref_k, positions)
    ref = torch.zeros(32, 2, page_size, 8, dim, dtype=dtype)
    ref[slots // page_size, 0, slots % page_size], ref[slots // page_size, 1, slots % page_size] = ref_k, v
    cache = torch.zeros_like(ref).cuda()
    norms = dict(q_norm=weights[0].cuda(), k_norm=weights[1].cuda(), eps=1e-6) if qk_norm else {}
    got_q = triton_ops.rope_write_kv(q.cuda(), k.cuda(), v.cuda(), cache[:, 0], cache[:, 1], slots.cuda(),
                                     cos=rope.cos.cuda(), sin=rope.sin.cuda(), positions=positions.cuda(), **norms)
    # float32: rounding of identical math; bf16: two units in the last place of a head's largest value
    for got, want in ((got_q.cpu(), ref_q), (cache[1:].cpu(), ref[1:])):
        scale = want.float().abs().amax(-1, keepdim=True)
        bound = 1e-5 * (1 + scale) if dtype == torch.float32 else 2**-6 * scale
        assert ((got.float() - want.float()).abs() <= bound).all()
    assert torch.equal(cache[1:, 1].cpu(), ref[1:, 1])  # v copied exactly
    written, q_in = torch.zeros_like(ref).cuda(), q.cuda()
    assert triton_ops.rope_write_kv(q_in, k.cuda(), v.cuda(), written[:, 0], written[:, 1], slots.cuda()) is q_in
    ref[slots // page_size, 0, slots % page_size] = k
    assert torch.equal(written[1:].cpu(), ref[1:])  # the write-only form (no rope): k and v as given


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind,qk_norm", [("paged", False), ("paged", True), ("depth", False), ("depth", True)])
def test_decoder_stack_with_triton_equals_the_reference_path(kind: str, qk_norm: bool, dtype: torch.dtype,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3-layer stack with the fused kernels (carried residual, add_rms_norm, rope_write_kv, silu_mul) against
    the same stack with Triton off, on the GPU: a paged prefill and a decode step with padded rows, or two depth
    sub-steps over a static cache. Hidden states, logits and KV caches within 1e-4 relative (float32) or 3e-2
    (bf16: the kernels round where the separate ops round differently; 1.5e-2 measured under the interpreter)."""
    fused = stack_outputs(kind, qk_norm, dtype, "cuda")
    monkeypatch.setattr(triton_ops, "enabled", lambda t: False)
    ref = stack_outputs(kind, qk_norm, dtype, "cuda")
    errors = relative_errors(fused, ref)
    assert max(errors) < (1e-4 if dtype == torch.float32 else 3e-2), errors


def test_depth_attention_matches_the_reference() -> None:
    """rt.depth_attention compiled (float32 and bfloat16) against rope_write_kv and attention in float32, as the
    interpreter check does."""
    check_depth_attention("cuda")


def test_decode_rows_match_the_reference() -> None:
    """rt.launch_rows' kernels compiled against lm_batch's PyTorch code on the GPU, as the interpreter checks do."""
    check_decode_rows("cuda")
    check_commit_rows("cuda")


def test_orpheus_step_kernels_match_the_reference() -> None:
    """models/orpheus/step_kernels compiled against their PyTorch forms on the GPU, as the interpreter check does."""
    check_orpheus_step("cuda")


def test_small_row_projections_match_the_reference() -> None:
    """rt.small_gemm's kernels compiled (FMA and tensor-core paths, float32 and bfloat16) against the unfused
    ops on the CPU, as the interpreter check does."""
    try:
        check_small_gemm("cuda")
    finally:
        small_gemm.forced = None


def test_float8_small_row_projections_match_the_reference() -> None:
    """The same kernels over float8 weights and their scales (`--quantization fp8`) against the reference over the
    dequantized weights."""
    try:
        check_small_gemm("cuda", fp8=True)
    finally:
        small_gemm.forced = None


def test_rows_quantize_to_float8_exactly_as_the_torch_ops_do() -> None:
    check_quantize_rows("cuda")


def test_norm_and_gate_quantize_their_rows_as_the_unfused_kernels_do() -> None:
    check_quantized_inputs("cuda")


def test_the_triton_float8_gemm_multiplies_the_dequantized_operands() -> None:
    """rt/fp8_gemm's Triton GEMM at several tiles (and cuBLASLt's) against the product of its two dequantized
    operands, as the interpreter check does."""
    check_scaled_mm("cuda")


@pytest.mark.parametrize("rows", [1, 4, 16, 17, 256])
def test_float8_projections_at_every_batch_match_their_references(rows: int) -> None:
    """A float8 projection as a decoder layer runs it (`project`: the small-rows kernel where the GPU's table serves
    the shape, else `Fp8Linear.forward`'s float8 GEMM) against the weight-only reference, within the rows' rounding
    to float8 (e4m3: 3 mantissa bits, ~2 % of a product); and the float8 GEMM against the product of its two
    dequantized operands."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 3072, generator=gen).to("cuda", torch.bfloat16)
    wq, scale = fp8_gemm.quantize_weight(torch.randn(5120, 3072, generator=gen).cuda() / 55)
    ref = fp8_gemm.reference_linear(x, wq, scale)
    assert max(relative_errors([project(Fp8Linear(wq, scale, None), x)], [ref])) < 4e-2
    xq, x_scale = fp8_gemm.quantize_rows(x)
    want = (xq.float() * x_scale) @ fp8_gemm.dequantize_weight(wq, scale, torch.float32).T
    assert max(relative_errors([fp8_gemm.scaled_linear(x, wq, scale)], [want])) < 1e-2  # bfloat16 output


@pytest.mark.parametrize("path", ["small_rows", "float8_gemm"])
def test_float8_decoder_stack_matches_the_dequantized_one(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bfloat16 stack with float8 projections, every one through rt.small_gemm (weight-only) or none (the
    float8 GEMM, rows quantized too), against the stack with the dequantized weights on the reference path."""
    config = small_gemm.BlockConfig(16, 64, dot=True) if path == "small_rows" else None
    monkeypatch.setattr(small_gemm, "forced", lambda kind, m, n, k: config)
    got = paged_stack_outputs(True, torch.bfloat16, "cuda", weights="fp8")
    monkeypatch.setattr(small_gemm, "forced", None)
    monkeypatch.setattr(triton_ops, "enabled", lambda t: False)
    ref = paged_stack_outputs(True, torch.bfloat16, "cuda", weights="dequantized")
    errors = relative_errors(got, ref)
    assert max(errors) < (3e-2 if path == "small_rows" else 8e-2), errors


@pytest.mark.parametrize("dot", [False, True])
@pytest.mark.parametrize("kind", ["paged", "depth"])
def test_decoder_stack_with_small_row_projections(kind: str, dot: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bf16 stack with every projection of <= 16 rows through rt.small_gemm against the stack with Triton off."""
    monkeypatch.setattr(small_gemm, "forced", lambda kind, m, n, k: small_gemm.BlockConfig(16, 64, dot=dot))
    fused = stack_outputs(kind, True, torch.bfloat16, "cuda")
    monkeypatch.setattr(small_gemm, "forced", None)
    monkeypatch.setattr(triton_ops, "enabled", lambda t: False)
    ref = stack_outputs(kind, True, torch.bfloat16, "cuda")
    errors = relative_errors(fused, ref)
    assert max(errors) < 3e-2, errors


DEPTH_STEP_CASES = [(True, True, 1), (False, True, 3), (True, False, 4), (False, False, 2)]


@pytest.mark.parametrize(("linear_in", "qk_norm", "rows"), DEPTH_STEP_CASES)
def test_depth_step_in_one_persistent_kernel(linear_in: bool, qk_norm: bool, rows: int) -> None:
    """rt.depth_step on the GPU: the persistent kernel (its phases separated by grid barriers) gives bit for bit
    what its phases launched one by one give, launch after launch (the barrier's counter carries over), and what
    the step's own kernels give within bfloat16 rounding."""
    from vox_serve.rt import depth_step

    persistent = depth_step_outputs(linear_in, qk_norm, rows, torch.bfloat16, "cuda", one_kernel=True, phased=False)
    again = depth_step_outputs(linear_in, qk_norm, rows, torch.bfloat16, "cuda", one_kernel=True, phased=False)
    phased = depth_step_outputs(linear_in, qk_norm, rows, torch.bfloat16, "cuda", one_kernel=True, phased=True)
    for got, ref, want in zip(persistent, phased, again, strict=True):
        assert torch.equal(got, ref) and torch.equal(got, want)
    unfused = depth_step_outputs(linear_in, qk_norm, rows, torch.bfloat16, "cuda", one_kernel=False)
    assert max(relative_errors(persistent, unfused)) < 2e-2
    assert depth_step._GRIDS  # the persistent launches ran


def test_depth_step_replays_in_a_cuda_graph() -> None:
    """The persistent step captured in a CUDA graph and replayed over new inputs equals eager launches: the graph
    keeps the barrier's counter in step."""
    from decoder_stack_helpers import DIMS, ROPE

    from vox_serve.layers.depth import DepthTransformer
    from vox_serve.rt import depth_step

    depth = DepthTransformer(dims=DIMS, in_proj=torch.nn.Identity(), num_positions=5, num_heads_out=4, rope=ROPE,
                             qk_norm=True).cuda().bfloat16()
    with torch.no_grad():
        for param in depth.parameters():
            param.copy_(torch.randn_like(param) / param.shape[-1] ** 0.5 + (1 if param.dim() == 1 else 0))
    depth_step.forced, depth_step.phased = True, False
    try:
        depth.allocate(max_rows=4)
        inputs = [torch.randn(2, 1, DIMS.hidden_size, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        with torch.no_grad():
            expected = [depth.step(x, start=2, head=1) for x in inputs]
            static = inputs[0].clone()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                depth.step(static, start=2, head=1)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = depth.step(static, start=2, head=1)
        for x, want in zip(inputs, expected, strict=True):
            static.copy_(x)
            graph.replay()
            assert torch.equal(out, want)
    finally:
        depth_step.forced = depth_step.phased = None


def _pdl_chain(x: torch.Tensor, delta: torch.Tensor, w: dict[str, torch.Tensor], cache: torch.Tensor,
               slots: torch.Tensor, rope: RotaryEmbedding, positions: torch.Tensor) -> list[torch.Tensor]:
    """Three layer-like rounds of the participating kernels, each reading the one before's output."""
    outs = []
    for _ in range(3):
        x, h = triton_ops.add_rms_norm(x, delta, w["norm"], 1e-6)
        qkv = small_gemm.linear(h, w["qkv"]).view(x.shape[0], 6, 64)
        q = triton_ops.rope_write_kv(qkv[:, :4], qkv[:, 4:5], qkv[:, 5:], cache[:, 0], cache[:, 1], slots,
                                     cos=rope.cos, sin=rope.sin, positions=positions)
        delta = small_gemm.linear(triton_ops.silu_mul(small_gemm.linear(q.view(x.shape[0], 256), w["up"])), w["down"])
        outs += [x, q]
    return outs + [delta, cache.clone()]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="programmatic dependent launch: compute capability >= 9.0")
def test_pdl_launches_in_a_cuda_graph_equal_plain_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """rt.pdl: the chain of participating kernels (add_rms_norm, small_gemm, rope_write_kv, silu_mul) captured in a
    CUDA graph with programmatic dependent launch, replayed over new inputs, gives bit for bit what plain eager
    launches give: every kernel waits for the one before it before touching memory."""
    from vox_serve.rt import pdl

    monkeypatch.setattr(small_gemm, "forced", lambda kind, m, n, k: small_gemm.BlockConfig(16, 64))
    gen = torch.Generator().manual_seed(9)
    rows, width = 4, 256
    w = {"norm": torch.rand(width, generator=gen) + 0.5, "qkv": torch.randn(6 * 64, width, generator=gen) / 16,
         "up": torch.randn(2 * 512, width, generator=gen) / 16, "down": torch.randn(width, 512, generator=gen) / 22}
    w = {name: t.bfloat16().cuda() for name, t in w.items()}
    rope = RotaryEmbedding(64, 256, {"rope_type": "default", "rope_theta": 10000.0})
    rope.cos, rope.sin = rope.cos.cuda(), rope.sin.cuda()
    inputs = [(torch.randn(rows, width, generator=gen).bfloat16().cuda(),
               torch.randn(rows, width, generator=gen).bfloat16().cuda(),
               torch.randint(0, 256, (rows,), generator=gen).cuda()) for _ in range(3)]
    slots = torch.arange(rows).cuda() * 3 + 16

    def run(x: torch.Tensor, d: torch.Tensor, pos: torch.Tensor, cache: torch.Tensor) -> list[torch.Tensor]:
        return _pdl_chain(x, d, w, cache, slots, rope, pos)

    monkeypatch.setenv(pdl.ENV, "0")
    expected = [run(x, d, pos, torch.zeros(8, 2, 16, 1, 64, dtype=torch.bfloat16, device="cuda"))
                for x, d, pos in inputs]
    monkeypatch.setenv(pdl.ENV, "1")
    assert pdl.launch_options(inputs[0][0]) == {"PDL": True, "launch_pdl": True}
    static = [t.clone() for t in inputs[0]]
    cache = torch.zeros(8, 2, 16, 1, 64, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(*static, cache)  # compiles the PDL variants outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run(*static, cache)
    for (x, d, pos), want in zip(inputs, expected, strict=True):
        for dst, src in zip(static, (x, d, pos), strict=True):
            dst.copy_(src)
        cache.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for got, ref in zip(outs, want, strict=True):
            assert torch.equal(got, ref)
    assert torch.equal(run(*inputs[1], torch.zeros_like(cache))[0], expected[1][0])  # eager PDL launches too

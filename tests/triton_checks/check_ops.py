"""Run under TRITON_INTERPRET=1 (tests/test_triton_ops.py): the fused kernels against their references."""

import sys

import torch

from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.rt import codec_kernels, kernels, triton_ops


def check_hash() -> None:
    seed = torch.tensor([0, 1, -5, 2**40 + 3, -(2**50)], dtype=torch.int64)
    offset = torch.tensor([0, 7, 2**33, -1, 12345], dtype=torch.int64)
    for n, salt in ((1, kernels._SALT_NORMAL_RADIUS), (37, kernels._SALT_UNIFORM), (4097, kernels._SALT_NORMAL_ANGLE)):
        ref = kernels._bits_to_uniform(kernels._hash_bits(seed, offset, n, salt))
        got = triton_ops.hash_uniform(seed, offset, n, salt)
        assert torch.equal(ref, got), (n, (ref - got).abs().max())


def check_snake() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 700, generator=gen) * 3
    alpha = torch.rand(1, 3, 1, generator=gen) + 0.2
    scale = (alpha + 1e-9).reciprocal()
    ref = x + scale * torch.sin(alpha * x).pow(2)
    assert (codec_kernels.snake(x, alpha, scale) - ref).abs().max() < 1e-5
    got16 = codec_kernels.snake(x.bfloat16(), alpha, scale)
    assert got16.dtype == torch.bfloat16 and (got16.float() - ref).abs().max() < 0.1
    # a strided input (a slice along time, as a transposed convolution's output is cut) and a left context
    wide = torch.randn(2, 3, 720, generator=gen)
    context = torch.randn(2, 3, 18, generator=gen)
    part = wide[..., 5:705]
    joined = codec_kernels.snake(part, alpha, scale, context=context)
    expected = torch.cat([context, part + scale * torch.sin(alpha * part).pow(2)], dim=-1)
    assert joined.shape == (2, 3, 718) and (joined - expected).abs().max() < 1e-5
    assert torch.equal(joined[..., :18], context)  # the context is copied exactly
    short = codec_kernels.snake(x[..., :5], alpha, scale, context=context[..., :6])  # rows shorter than a block
    assert (short[..., 6:] - ref[..., :5]).abs().max() < 1e-5 and torch.equal(short[..., :6], context[..., :6])
    bias = torch.randn(3, generator=gen)  # a convolution's bias, added in the kernel
    shifted = part + bias[:, None]
    got = codec_kernels.snake(part, alpha, scale, bias=bias)
    assert (got - (shifted + scale * torch.sin(alpha * shifted).pow(2))).abs().max() < 1e-5
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


def check_depthwise() -> None:
    gen = torch.Generator().manual_seed(2)
    for dilation, padding, bias in ((1, 3, True), (3, 9, True), (9, 0, False)):
        conv = torch.nn.Conv1d(5, 5, 7, dilation=dilation, padding=padding, groups=5, bias=bias)
        x = torch.randn(2, 5, 300, generator=gen)
        with torch.no_grad():
            ref = conv(x)
            got = codec_kernels.depthwise_conv1d(x, conv.weight, conv.bias, dilation, padding)
        assert got.shape == ref.shape and (got - ref).abs().max() < 1e-5, (dilation, (got - ref).abs().max())


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

    qwen = Qwen3CodecDecoder.random(Qwen3CodecConfig.from_dict(TINY_CODEC_CONFIG), seed=3)
    snac = SnacDecoder.random(SnacConfig.from_dict(SNAC_TINY_CONFIG), seed=5)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # random() zeroes these: non-zero Snake factors and biases, so every term counts
        for name, p in [*qwen.named_parameters(), *snac.named_parameters()]:
            if name.endswith(("alpha", "beta", "bias")):
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    codes = torch.randint(0, 2048, (2, 5, qwen.config.num_quantizers), generator=torch.Generator().manual_seed(4))
    frames = torch.randint(0, 4096, (2, 3, 7), generator=torch.Generator().manual_seed(6))
    seed = torch.tensor([11, 12])

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return qwen.decode(codes, max_chunk_frames=2), snac.decode(orpheus_frames_to_codes(frames), seed)

    ref_qwen, ref_snac = run()
    triton_ops.enabled = lambda t: True  # every kernel on, as for CUDA tensors
    got_qwen, got_snac = run()
    for got, ref in ((got_qwen, ref_qwen), (got_snac, ref_snac)):
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


if __name__ == "__main__":
    globals()[f"check_{sys.argv[1]}"]()
    print("ok")

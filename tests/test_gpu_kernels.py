"""GPU tier: the compiled Triton kernels equal the PyTorch reference kernels (run on the CPU)."""

from __future__ import annotations

import pytest
import torch
from sampling_helpers import random_case, to_cuda

from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.rt import codec_kernels, kernels, triton_ops

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
    with torch.no_grad():
        ref = snac.decode(orpheus_frames_to_codes(frames), seed)
        got = snac.to("cuda", dtype).decode(orpheus_frames_to_codes(frames.cuda()), seed.cuda()).float().cpu()
    assert _snr_db(got, ref) >= floor, _snr_db(got, ref)

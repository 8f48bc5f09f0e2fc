"""GPU tier: the compiled Triton kernels equal the PyTorch reference kernels (run on the CPU)."""

from __future__ import annotations

import pytest
import torch
from sampling_helpers import random_case, to_cuda

from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.rt import kernels, triton_ops

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
    assert (triton_ops.snake(x.cuda(), alpha.cuda(), scale.cuda()).cpu() - ref).abs().max() < 1e-4
    conv = torch.nn.Conv1d(64, 64, 7, dilation=3, padding=9, groups=64)
    with torch.no_grad():
        ref = conv(x)
        assert (triton_ops.conv1d(conv.cuda(), x.cuda()).cpu() - ref).abs().max() < 1e-4
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

"""GPU tier: the compiled Triton kernels equal the PyTorch reference kernels (run on the CPU)."""

from __future__ import annotations

import pytest
import torch

from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.rt import kernels, triton_ops

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or triton_ops.triton is None, reason="CUDA + Triton")]


def test_hash_uniforms_are_bit_identical() -> None:
    seed = torch.randint(-2**62, 2**62, (37,), dtype=torch.int64)
    offset = torch.randint(0, 2**40, (37,), dtype=torch.int64)
    ref = kernels.hash_uniform(seed, offset, 4097)
    assert torch.equal(kernels.hash_uniform(seed.cuda(), offset.cuda(), 4097).cpu(), ref)


@pytest.mark.parametrize("vocab", [2048, 3072, 4097])
def test_fused_sampler_draws_the_reference_tokens(vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    rows = 256
    logits = torch.randn(rows, vocab, generator=gen) * 3
    allowed = torch.rand(rows, vocab, generator=gen) > 0.1
    allowed[:, 0] = True
    history = torch.randint(-1, vocab, (rows, 16), generator=gen)
    params = kernels.SamplingTensors(
        temperature=torch.rand(rows, generator=gen) * 1.5, top_k=torch.randint(0, 60, (rows,), generator=gen),
        top_p=torch.rand(rows, generator=gen) * 0.5 + 0.5, min_p=torch.rand(rows, generator=gen) * 0.1,
        repetition_penalty=torch.rand(rows, generator=gen) + 1.0, seed=torch.randint(0, 2**40, (rows,), generator=gen),
        offset=torch.randint(0, 10**6, (rows,), generator=gen))
    params.temperature[:32] = 0.0
    ref = kernels.sample(logits, params, history, allowed)
    cuda = kernels.SamplingTensors(**{k: v.cuda() for k, v in vars(params).items()})
    got = kernels.sample(logits.cuda(), cuda, history.cuda(), allowed.cuda()).cpu()
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

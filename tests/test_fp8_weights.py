"""`--quantization fp8`: float8 weights per output row (rt/fp8_gemm, layers/fp8), on the CPU.

The kernels' checks are tests/test_triton_ops.py's `small_gemm_fp8` and `quantize_rows` (Triton's interpreter) and
tests/test_gpu_kernels.py (compiled); both runtimes' WAVs with the flag are compared in tests/test_rust_runtime.py.
"""

from __future__ import annotations

import pytest
import torch
from decoder_stack_helpers import paged_stack_outputs
from engine_helpers import build_program
from torch import nn

from vox_serve.cli import CliError, build_config, check_flags, given_flags
from vox_serve.config import CacheConfig, ConfigError, ModelConfig, VoxConfig
from vox_serve.engine.build import load_program
from vox_serve.layers.fp8 import PROJECTIONS, Fp8Linear, decoder_layers
from vox_serve.rt import fp8_gemm


def _rows(seed: int, m: int, k: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=gen) * torch.logspace(-3, 2, m)[:, None]  # rows of very different sizes


def test_each_weight_row_spans_the_float8_range_within_half_a_step() -> None:
    w = _rows(0, 6, 300)
    wq, scale = fp8_gemm.quantize_weight(w)
    assert wq.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (6,)
    assert torch.equal(wq.float().abs().amax(dim=1), torch.full((6,), fp8_gemm.FP8_MAX))
    back = fp8_gemm.dequantize_weight(wq, scale, torch.float32)
    # e4m3: 3 mantissa bits (half a step: 1/16 of the value), subnormal steps of 2^-9 times the scale
    bound = w.abs() / 16 + scale[:, None] * 2.0**-10
    assert bool(((back - w).abs() <= bound * (1 + 1e-6)).all())


def test_a_zero_row_keeps_a_finite_scale_and_stays_zero() -> None:
    w = _rows(1, 3, 64)
    w[1] = 0
    wq, scale = fp8_gemm.quantize_weight(w)
    assert scale[1] > 0 and torch.isfinite(scale).all()
    assert torch.equal(wq[1].float(), torch.zeros(64))
    xq, x_scale = fp8_gemm.quantize_rows(w)
    assert torch.equal(x_scale.flatten(), scale) and torch.equal(xq.float(), wq.float())


def test_the_weight_only_reference_multiplies_by_the_dequantized_weight() -> None:
    x, w = _rows(2, 5, 96), _rows(3, 40, 96)
    wq, scale = fp8_gemm.quantize_weight(w)
    bias = torch.randn(40)
    got = fp8_gemm.reference_linear(x, wq, scale, bias)
    want = x @ fp8_gemm.dequantize_weight(wq, scale, torch.float32).T + bias
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)
    assert torch.allclose(got, x @ w.T + bias, rtol=0.1, atol=0.05 * (x.abs() @ w.abs().T).max())


def test_the_float8_gemm_multiplies_the_quantized_rows_by_the_quantized_weight() -> None:
    """`scaled_linear`'s scales are applied per row of x and per output column (torch._scaled_mm runs on the CPU
    too): the product of the two dequantized operands."""
    x, w = _rows(4, 7, 128).bfloat16(), _rows(5, 48, 128).flip(0)
    wq, scale = fp8_gemm.quantize_weight(w)
    xq, x_scale = fp8_gemm.quantize_rows(x)
    got = fp8_gemm.scaled_linear(x, wq, scale)
    want = (xq.float() * x_scale) @ fp8_gemm.dequantize_weight(wq, scale, torch.float32).T
    assert got.dtype == torch.bfloat16
    row_size = want.abs().amax(dim=1, keepdim=True)
    assert bool(((got.float() - want).abs() <= 1e-2 * row_size).all())  # bfloat16's rounding of the output


def test_a_quantized_decoder_stack_equals_one_with_the_dequantized_weights() -> None:
    """Prefill, decode and the KV written, through the decoder layers' own paths (the fused small-rows kernels
    take the scales on a GPU; here `Fp8Linear.forward`'s reference): what the float8 weights stand for."""
    got = paged_stack_outputs(qk_norm=True, dtype=torch.float32, device="cpu", weights="fp8")
    want = paged_stack_outputs(qk_norm=True, dtype=torch.float32, device="cpu", weights="dequantized")
    model = paged_stack_outputs(qk_norm=True, dtype=torch.float32, device="cpu")
    for g, w, m in zip(got, want, model, strict=True):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-4), (g - w).abs().max()
        assert not torch.equal(g, m)  # the quantization did change the weights


def _config(model: str, **model_fields: str) -> VoxConfig:
    return VoxConfig(model=ModelConfig(model=model, device="cpu", load_format="dummy", **model_fields),
                     cache=CacheConfig(max_num_pages=64))


def test_orpheus_loads_its_decoder_layers_in_float8_and_keeps_the_rest() -> None:
    plain = load_program(_config("orpheus-tiny"))
    program = build_program(_config("orpheus-tiny", quantization="fp8"))
    layers = decoder_layers([program.lm])
    assert layers and all(isinstance(getattr(la, p), Fp8Linear) for la in layers for p in PROJECTIONS)
    assert type(program.lm.lm_head) is nn.Linear and program.lm.lm_head.weight.dtype == torch.float32
    projection_bytes = sum(getattr(la, p).weight.numel() for la in layers for p in PROJECTIONS)
    assert plain.weights_bytes() - program.weights_bytes() == 3 * projection_bytes - 4 * sum(
        getattr(la, p).weight_scale.numel() for la in layers for p in PROJECTIONS)  # float32: 4 bytes -> 1 + scales


@pytest.mark.parametrize("model", ["qwen3-tts-tiny", "csm-tiny"])
def test_every_decoder_layer_of_the_model_is_quantized(model: str) -> None:
    program = load_program(_config(model, quantization="fp8"))
    layers = decoder_layers(program.quantizable_modules())
    assert len(layers) >= 2
    assert all(isinstance(getattr(la, p), Fp8Linear) for la in layers for p in PROJECTIONS)


def test_a_model_without_shared_decoder_layers_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="--quantization fp8: zonos-tiny has no decoder layers"):
        load_program(_config("zonos-tiny", quantization="fp8"))


@pytest.mark.parametrize("runtime", ["rust", "python"])
def test_the_flag_reaches_the_config_in_both_runtimes(runtime: str) -> None:
    def config_of(*argv: str) -> VoxConfig:
        return build_config(check_flags(given_flags(list(argv)), runtime, True)[0], runtime)

    assert config_of("--quantization", "fp8").model.quantization == "fp8"
    assert config_of().model.quantization == "none"
    with pytest.raises((CliError, SystemExit)):
        config_of("--quantization", "int4")

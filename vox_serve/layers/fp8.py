"""`--quantization fp8`: the decoder layers' projections with float8 weights (rt/fp8_gemm).

After its weights load, a program's decoder layers (`Program.quantizable_modules`, the shared `DecoderLayer`s in
them) have their four projections (q/k/v, o, gate/up, down) replaced by `Fp8Linear`s: each weight quantized per
output row to float8 e4m3 with a float32 scale, the bfloat16 weight freed. Embeddings, heads, norms and the codec
keep the model's dtype: the projections are where a decode step's bytes are (Orpheus-3B: 5.6 of its 6.3 GB).
The decoder layer passes the scales to rt/small_gemm's fused kernels where its table serves a shape, and
`Fp8Linear.forward` (the float8 GEMM) serves the rest.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

from vox_serve.layers.decoder import DecoderLayer
from vox_serve.rt import fp8_gemm

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class Fp8Linear(nn.Module):
    """y = x @ (weight * weight_scale).T (+ bias): weight [out, in] float8 e4m3, weight_scale [out] float32."""

    def __init__(self, weight: Tensor, weight_scale: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        if weight.dtype != fp8_gemm.FP8 or weight_scale.shape != weight.shape[:1]:
            raise ValueError(f"a float8 e4m3 weight [out, in] and a scale [out]; got {weight.dtype} "
                             f"{tuple(weight.shape)} and {tuple(weight_scale.shape)}")
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale = nn.Parameter(weight_scale, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @classmethod
    def of(cls, linear: nn.Linear) -> Fp8Linear:
        """The float8 form of a Linear (its weight quantized per output row)."""
        weight, scale = fp8_gemm.quantize_weight(linear.weight)
        return cls(weight, scale, linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return fp8_gemm.linear(x, self.weight, self.weight_scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float8 e4m3 per-row scales"


def decoder_layers(modules: Iterable[nn.Module]) -> list[DecoderLayer]:
    """Every DecoderLayer inside `modules`."""
    return [m for module in modules for m in module.modules() if isinstance(m, DecoderLayer)]


def quantize_decoder_layers(layers: Iterable[DecoderLayer]) -> None:
    """Replace each layer's projections (nn.Linear) with their Fp8Linear forms."""
    for layer in layers:
        for name in PROJECTIONS:
            setattr(layer, name, Fp8Linear.of(getattr(layer, name)))

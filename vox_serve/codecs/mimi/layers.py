"""Mimi's transformer layer and SEANet decoder blocks, written to stream (see `vox_serve.codecs.streaming`).

Module names follow transformers' `MimiModel` (`self_attn.q_proj`, `mlp.fc1`, `block.1.conv`, ...) so
checkpoint keys load without renaming.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.codecs.mimi.config import MimiConfig
from vox_serve.codecs.streaming import CausalConv, CausalUpConv, LayerScale, WindowedAttention


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    """Pre-LayerNorm attention and GELU MLP, each residual branch behind a layer scale."""

    def __init__(self, c: MimiConfig):
        super().__init__()
        d = c.hidden_size
        self.self_attn = WindowedAttention(d, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                           c.attention_bias)
        self.mlp = Mlp(d, c.intermediate_size)
        self.input_layernorm = nn.LayerNorm(d, eps=c.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(d, eps=c.norm_eps)
        self.self_attn_layer_scale = LayerScale(d, c.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(d, c.layer_scale_initial_scale)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, k_cache: Tensor, v_cache: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        h, k, v = self.self_attn(self.input_layernorm(x), rope, mask, k_cache, v_cache)
        x = x + self.self_attn_layer_scale(h)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x))), k, v


class Elu(nn.ELU):
    """ELU that takes (and ignores) the streaming states, so a SEANet stack is one list of stream layers."""

    def forward(self, x: Tensor, states: list[Tensor] | None = None) -> Tensor:
        return super().forward(x)


class ResnetBlock(nn.Module):
    """x + conv1x1(elu(conv_k(elu(x)))); indices 1 and 3 hold the convolutions, as in the checkpoint."""

    def __init__(self, dim: int, c: MimiConfig, dilation: int):
        super().__init__()
        hidden = dim // c.compress
        self.block = nn.ModuleList([Elu(), CausalConv(dim, hidden, c.residual_kernel_size, dilation=dilation),
                                    Elu(), CausalConv(hidden, dim, 1)])

    def forward(self, x: Tensor, states: list[Tensor]) -> Tensor:
        h = x
        for layer in self.block:
            h = layer(h, states)
        return x + h


class SeanetDecoder(nn.Module):
    """25 Hz latents [B, hidden, n] -> audio [B, 1, n * hop_length]: conv, then per upsampling ratio ELU,
    transposed conv and residual blocks, then ELU and the output conv. Layer indices as in the checkpoint."""

    def __init__(self, c: MimiConfig):
        super().__init__()
        width = c.num_filters * 2 ** len(c.upsampling_ratios)
        layers: list[nn.Module] = [CausalConv(c.hidden_size, width, c.kernel_size)]
        for ratio in c.upsampling_ratios:
            layers += [Elu(), CausalUpConv(width, width // 2, 2 * ratio, ratio)]
            layers += [ResnetBlock(width // 2, c, c.dilation_growth_rate**j) for j in range(c.num_residual_layers)]
            width //= 2
        layers += [Elu(), CausalConv(c.num_filters, 1, c.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor, states: list[Tensor]) -> Tensor:
        for layer in self.layers:
            x = layer(x, states)
        return x


def random_weights(model: nn.Module, c: MimiConfig, seed: int, table_std: float) -> None:
    """Deterministic random weights of a Mimi half: initial layer scales, unit norms, zero biases, codebook
    tables of `table_std`, conv / linear weights of std 1/sqrt(fan in)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale"):
                p.fill_(c.layer_scale_initial_scale)
            elif "norm" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            elif name.endswith("tables"):
                p.copy_(torch.randn(p.shape, generator=g) * table_std)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))

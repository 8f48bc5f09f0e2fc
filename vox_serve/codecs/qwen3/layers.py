"""Building blocks of the Qwen3-TTS-Tokenizer-12Hz decoder, each written to stream.

The streaming convention (per-request ``states`` indexed by ``state_id``) and the causal convolutions and
windowed attention shared with Mimi are in `vox_serve.codecs.streaming`. Module and parameter names follow
the reference (``qwen_tts/core/tokenizer_12hz``) so that checkpoint keys load without renaming.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.codecs.streaming import (
    CausalConv,
    CausalUpConv,
    LayerScale,
    StatefulLayer,
    WindowedAttention,
    run_windowed,
    window_mask,
    window_rope,
)
from vox_serve.layers.decoder import RMSNorm
from vox_serve.rt import codec_kernels, implicit_gemm, triton_ops
from vox_serve.rt.derived import Derived


class SnakeBeta(nn.Module):
    """x + sin(x * e^alpha)^2 / (e^beta + 1e-9), per channel (alpha, beta stored as logs)."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))
        self._derived = Derived(lambda a, b: (a.exp()[None, :, None], 1.0 / (b.exp()[None, :, None] + 1e-9)))

    def forward(self, x: Tensor, states: list[Tensor] | None = None, bias: Tensor | None = None) -> Tensor:
        """[B, C, T]; `bias` (GPUs): a convolution's bias, added to x first in the same kernel."""
        alpha, inv_beta = self.factors()
        if triton_ops.enabled(x):
            return codec_kernels.snake(x, alpha, inv_beta, bias=bias)
        x = x if bias is None else x + bias[:, None]
        return x + inv_beta * torch.sin(x * alpha).pow(2)

    def with_context(self, x: Tensor, context: Tensor) -> Tensor:
        """cat([context, self(x)], -1), one pass on GPUs (a causal convolution's input)."""
        if triton_ops.enabled(x):
            return codec_kernels.snake(x, *self.factors(), context=context)
        return torch.cat([context, self(x)], dim=-1)

    def factors(self) -> tuple[Tensor, ...]:
        """(e^alpha, 1 / (e^beta + 1e-9)), each [1, C, 1]."""
        return self._derived.get(self.alpha, self.beta)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, states: list[Tensor]) -> Tensor:  # [B, C, T]
        h = self.norm(self.dwconv(x, states).transpose(1, 2))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1, self.act2 = SnakeBeta(dim), SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: Tensor, states: list[Tensor]) -> Tensor:
        if not triton_ops.enabled(x):
            return x + self.conv2(self.conv1(x, states, act=self.act1), states, act=self.act2)
        conv1, conv2 = self.conv1.conv, self.conv2.conv
        if codec_kernels.gemm_convs(conv1) and codec_kernels.gemm_convs(conv2):  # GPUs: 3 passes
            h = implicit_gemm.conv_gemm(self.conv1.joined(x, states, self.act1), implicit_gemm.tap_weights(conv1),
                                        conv1.bias, conv1.dilation[0], snake=self.act2.factors())
            return implicit_gemm.pointwise_conv1d(h, conv2.weight, conv2.bias, residual=x)
        # else each convolution's bias rides in the kernel after it (SnakeBeta, the residual add)
        h = self.act2(self.conv1(x, states, act=self.act1, bias=False), bias=self.conv1.conv.bias)
        return codec_kernels.add_residual(x, self.conv2(h, states, bias=False), self.conv2.conv.bias)


class DecoderBlock(nn.Module):
    """SnakeBeta, x``rate`` transposed conv (kernel 2*rate), residual units with dilations 1, 3, 9."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(cin), CausalUpConv(cin, cout, 2 * rate, rate),
                                    *(ResidualUnit(cout, d) for d in (1, 3, 9))])

    def forward(self, x: Tensor, states: list[Tensor]) -> Tensor:
        act, up, *units = self.block
        x = up(x, states, act=act)
        for unit in units:
            x = unit(x, states)
        return x


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, ffn: int, eps: float,
                 layer_scale: float, bias: bool):
        super().__init__()
        self.self_attn = WindowedAttention(dim, heads, kv_heads, head_dim, bias)
        self.mlp = Mlp(dim, ffn)
        self.input_layernorm = RMSNorm(dim, eps)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.self_attn_layer_scale = LayerScale(dim, layer_scale)
        self.mlp_layer_scale = LayerScale(dim, layer_scale)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, k_cache: Tensor, v_cache: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        h, k, v = self.self_attn(self.input_layernorm(x), rope, mask, k_cache, v_cache)
        x = x + self.self_attn_layer_scale(h)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x))), k, v


class SlidingWindowTransformer(StatefulLayer):
    """Causal transformer whose queries see the last ``window`` positions (themselves included).

    State: rotated keys and values of the previous window-1 frames, [layers, 2, kv_heads, window-1, head_dim];
    together with the frame position ``pos`` it gives every query exactly its window.
    """

    def __init__(self, latent: int, dim: int, layers: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                 window: int, rope_theta: float, eps: float, layer_scale: float, bias: bool):
        super().__init__()
        self.input_proj = nn.Linear(latent, dim)
        self.layers = nn.ModuleList(TransformerLayer(dim, heads, kv_heads, head_dim, ffn, eps, layer_scale, bias)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim, eps)
        self.output_proj = nn.Linear(dim, latent)
        self.window, self.cache_len = window, window - 1
        self.kv_heads, self.head_dim, self.rope_theta = kv_heads, head_dim, rope_theta

    def state_shape(self) -> tuple[int, ...]:
        return (len(self.layers), 2, self.kv_heads, self.cache_len, self.head_dim)

    def forward(self, x: Tensor, states: list[Tensor], pos: Tensor) -> Tensor:  # [B, N, latent], pos [B]
        n = x.shape[1]
        h = self.input_proj(x)
        rope = window_rope(pos, n, self.head_dim, self.rope_theta, h.dtype)
        mask = window_mask(pos, n, self.cache_len, self.window)
        h, states[self.state_id] = run_windowed(self.layers, h, states[self.state_id], rope, mask)
        return self.output_proj(self.norm(h))

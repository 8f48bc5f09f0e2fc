"""Building blocks of the Qwen3-TTS-Tokenizer-12Hz decoder, each written to stream.

Every layer that looks back in time takes ``states``, a list of per-request left contexts indexed by the
layer's ``state_id`` (assigned by the decoder; shapes from ``state_shape()``, batch first). A call reads
its context, runs on ``[context, input]`` and puts the new context back in the list. Zero contexts (and a
frame position of 0) are exactly the reference's zero left padding, so a one-shot decode is one call on a
fresh state and a stream of calls gives the same audio. Module and parameter names follow the reference
(``qwen_tts/core/tokenizer_12hz``) so that checkpoint keys load without renaming.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.layers.decoder import RMSNorm
from vox_serve.rt import triton_ops


class StatefulLayer(nn.Module):
    """A layer with per-request streaming state; ``state_id`` is its entry in the ``states`` list."""

    state_id: int = -1

    def state_shape(self) -> tuple[int, ...] | None:
        """Shape of one request's state (without the batch dim); None when the layer keeps none."""
        raise NotImplementedError


class CausalConv(StatefulLayer):
    """Stride-1 Conv1d padded on the left only; context: the last (kernel-1)*dilation inputs [C_in, ctx]."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context_len = (kernel - 1) * dilation

    def state_shape(self) -> tuple[int, ...] | None:
        return (self.conv.in_channels, self.context_len) if self.context_len else None

    def forward(self, x: Tensor, states: list[Tensor]) -> Tensor:  # [B, C_in, N] -> [B, C_out, N]
        if self.context_len:
            x = torch.cat([states[self.state_id], x], dim=-1)
            states[self.state_id] = x[..., -self.context_len:]
        return triton_ops.conv1d(self.conv, x)


class CausalUpConv(StatefulLayer):
    """ConvTranspose1d with its right overhang cut (output N*stride); context: the last ceil(k/s)-1 inputs."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.context_len = -(-kernel // stride) - 1

    def state_shape(self) -> tuple[int, ...] | None:
        return (self.conv.in_channels, self.context_len) if self.context_len else None

    def forward(self, x: Tensor, states: list[Tensor]) -> Tensor:  # [B, C_in, N] -> [B, C_out, N * stride]
        n = x.shape[-1]
        if self.context_len:
            x = torch.cat([states[self.state_id], x], dim=-1)
            states[self.state_id] = x[..., -self.context_len:]
        start = self.context_len * self.stride
        return self.conv(x)[..., start:start + n * self.stride]


class SnakeBeta(nn.Module):
    """x + sin(x * e^alpha)^2 / (e^beta + 1e-9), per channel (alpha, beta stored as logs)."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor, states: list[Tensor] | None = None) -> Tensor:  # [B, C, T]
        alpha = self.alpha.exp()[None, :, None]
        inv_beta = 1.0 / (self.beta.exp()[None, :, None] + 1e-9)
        if triton_ops.enabled(x):
            return triton_ops.snake(x, alpha, inv_beta)
        return x + inv_beta * torch.sin(x * alpha).pow(2)


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
        return x + self.conv2(self.act2(self.conv1(self.act1(x), states)), states)


class DecoderBlock(nn.Module):
    """SnakeBeta, x``rate`` transposed conv (kernel 2*rate), residual units with dilations 1, 3, 9."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(cin), CausalUpConv(cin, cout, 2 * rate, rate),
                                    *(ResidualUnit(cout, d) for d in (1, 3, 9))])

    def forward(self, x: Tensor, states: list[Tensor]) -> Tensor:
        for m in self.block:
            x = m(x, states)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=bias)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, k_cache: Tensor, v_cache: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, N, dim]; caches [B, kv_heads, C, head_dim] (rotated keys); mask [B, 1, N, C+N] bool.

        Returns the output [B, N, dim] and the keys/values of all C+N positions.
        """
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        k, v = torch.cat([k_cache, k], dim=2), torch.cat([v_cache, v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1)), k, v


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE; x [B, H, N, D], cos/sin [B, 1, N, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class TransformerLayer(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, ffn: int, eps: float,
                 layer_scale: float, bias: bool):
        super().__init__()
        self.self_attn = Attention(dim, heads, kv_heads, head_dim, bias)
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

    def rope(self, pos: Tensor, n: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin [B, 1, N, head_dim] at frames pos[b] + i.

        The angle is formed in float64 from the reference's float32 frequencies, so that long streams keep
        the precision the reference has at its small positions (it restarts at 0 every 300 frames).
        """
        d = self.head_dim
        exponent = torch.arange(0, d, 2, device=pos.device, dtype=torch.int64).float() / d
        inv_freq = (1.0 / self.rope_theta ** exponent).double()
        frames = (pos[:, None] + torch.arange(n, device=pos.device)).double()
        angle = (frames[..., None] * inv_freq).repeat(1, 1, 2)[:, None]
        return angle.cos().to(dtype), angle.sin().to(dtype)

    def mask(self, pos: Tensor, n: int) -> Tensor:
        """[B, 1, N, C+N] bool: key frame k is visible to query frame q iff 0 <= k <= q < k + window."""
        steps = torch.arange(-self.cache_len, n, device=pos.device)
        key = pos[:, None] + steps  # [B, C+N]
        query = key[:, self.cache_len:]  # [B, N]
        age = query[:, :, None] - key[:, None, :]
        return ((key[:, None, :] >= 0) & (age >= 0) & (age < self.window))[:, None]

    def forward(self, x: Tensor, states: list[Tensor], pos: Tensor) -> Tensor:  # [B, N, latent], pos [B]
        kv = states[self.state_id]
        n = x.shape[1]
        h = self.input_proj(x)
        rope, mask = self.rope(pos, n, h.dtype), self.mask(pos, n)
        new_kv = []
        for i, layer in enumerate(self.layers):
            h, k, v = layer(h, rope, mask, kv[:, i, 0], kv[:, i, 1])
            keep = k.shape[2] - self.cache_len  # not k[:, :, -cache_len:], wrong for a cache of 0
            new_kv.append(torch.stack([k[:, :, keep:], v[:, :, keep:]], dim=1))
        states[self.state_id] = torch.stack(new_kv, dim=1)
        return self.output_proj(self.norm(h))

"""The pre-norm transformer decoder layer shared by the Llama-style and Qwen3-style models.

RMSNorm -> fused q/k/v -> (optional per-head q/k RMSNorm, Qwen3) -> rope -> attention -> o_proj,
then RMSNorm -> fused gate/up SwiGLU -> down_proj. Attention is whatever `attend` does with the
rotated q, k and v: the paged KV backend for LMs, a static cache for a depth transformer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.rt import triton_ops

Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]  # (layer, q [T,Hq,D], k, v [T,Hkv,D]) -> [T,Hq,D]


@dataclass(frozen=True)
class DecoderDims:
    """The sizes of a decoder stack, as transformers' config.json files of Llama and Qwen models give them."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float

    @staticmethod
    def fields_from_hf(cfg: dict[str, Any], default_eps: float) -> dict[str, Any]:
        """The DecoderDims fields of a config.json (KV heads default to the heads, head_dim to width / heads)."""
        heads = cfg["num_attention_heads"]
        return dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                    intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
                    num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
                    head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                    rms_norm_eps=cfg.get("rms_norm_eps", default_eps))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.is_cuda:  # one fused kernel (math in float32, the weight applied before the cast back)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, eps: float, layer_id: int, qk_norm: bool = False) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.split = (q_size, kv_size, kv_size)
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.qkv_proj = nn.Linear(hidden_size, sum(self.split), bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        self.qk_norm = qk_norm
        self.o_proj = nn.Linear(q_size, hidden_size, bias=False)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor, positions: Tensor, rope: RotaryEmbedding, attend: Attend) -> Tensor:
        """x [T, hidden], positions [T] -> [T, hidden]."""
        t = x.shape[0]
        q, k, v = self.qkv_proj(self.input_layernorm(x)).split(self.split, dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, k, positions)
        out = attend(self.layer_id, q, k, v.view(t, self.num_kv_heads, self.head_dim))
        if triton_ops.enabled(x):  # the residual add with the norm after it, and the SwiGLU gate: one kernel each
            norm = self.post_attention_layernorm
            x, h = triton_ops.add_rms_norm(x, self.o_proj(out.reshape(t, -1)), norm.weight, norm.eps)
            return x + self.down_proj(triton_ops.silu_mul(self.gate_up_proj(h)))
        x = x + self.o_proj(out.reshape(t, -1))
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)

"""The Zonos v0.1 transformer LM over our paged KV cache: 9 summed code embeddings in, 9 heads out.

Module names mirror the checkpoint keys (`backbone.layers.{i}.mixer.in_proj.weight`, `embeddings.{k}`,
`heads.{k}`, `prefix_conditioner.*`), so loading is one strict `load_state_dict`. A block is pre-LayerNorm
(with bias) -> fused q|k|v -> interleaved RoPE over the whole head -> attention -> out_proj, then LayerNorm
-> `fc1` split into (value, gate) -> `fc2(value * silu(gate))`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.models.zonos.conditioning import PrefixConditioner
from vox_serve.models.zonos.config import EMBED_ROWS, HEAD_ROWS, NUM_CODEBOOKS, ZonosConfig
from vox_serve.rt.attention import AttentionBackend, AttentionBuffers

ROPE_THETA = 10000.0
MAX_POSITIONS = 16384  # the reference's rotary table length


class Attention(nn.Module):
    def __init__(self, cfg: ZonosConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.in_proj = nn.Linear(cfg.d_model, sum(self.split), bias=False)
        self.out_proj = nn.Linear(q_size, cfg.d_model, bias=False)


class FeedForward(nn.Module):
    def __init__(self, cfg: ZonosConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, 2 * cfg.mlp_dim, bias=False)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        value, gate = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(value * F.silu(gate))


class Block(nn.Module):
    def __init__(self, cfg: ZonosConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mixer = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = FeedForward(cfg)

    def forward(self, x: Tensor, positions: Tensor, rope: RotaryEmbedding, attention: AttentionBackend,
                bufs: AttentionBuffers) -> Tensor:
        """x [T, d], positions [T] -> [T, d]."""
        t, mix = x.shape[0], self.mixer
        q, k, v = mix.in_proj(self.norm(x)).split(mix.split, dim=-1)
        q, k = rope(q.view(t, mix.num_heads, mix.head_dim), k.view(t, mix.num_kv_heads, mix.head_dim), positions)
        out = attention.forward(self.layer_id, q, k, v.view(t, mix.num_kv_heads, mix.head_dim), bufs)
        x = x + mix.out_proj(out.reshape(t, -1))
        return x + self.mlp(self.norm2(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ZonosConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm_f = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.rope = RotaryEmbedding(cfg.head_dim, MAX_POSITIONS, {"rope_type": "default", "rope_theta": ROPE_THETA},
                                    interleaved=True)

    def forward(self, x: Tensor, positions: Tensor, attention: AttentionBackend, bufs: AttentionBuffers) -> Tensor:
        for layer in self.layers:
            x = layer(x, positions, self.rope, attention, bufs)
        return self.norm_f(x)


class ZonosLM(nn.Module):
    """Backbone, code embeddings, heads and the prefix conditioner of one checkpoint."""

    def __init__(self, cfg: ZonosConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = Backbone(cfg)
        self.prefix_conditioner = PrefixConditioner(cfg)
        self.embeddings = nn.ModuleList(nn.Embedding(EMBED_ROWS, cfg.d_model) for _ in range(NUM_CODEBOOKS))
        self.heads = nn.ModuleList(nn.Linear(cfg.d_model, HEAD_ROWS, bias=False) for _ in range(NUM_CODEBOOKS))

    def embed_codes(self, codes: Tensor) -> Tensor:
        """codes [T, 9] (0..1025) -> [T, d]: the sum of the 9 codebook embeddings, added in codebook order
        as the reference does (so float32 sums agree bit for bit)."""
        x = self.embeddings[0](codes[:, 0])
        for k in range(1, NUM_CODEBOOKS):
            x = x + self.embeddings[k](codes[:, k])
        return x

    def forward(self, x: Tensor, positions: Tensor, attention: AttentionBackend, bufs: AttentionBuffers) -> Tensor:
        """Input embeddings x [T, d] (prefix vectors or summed codes), positions [T] -> hidden [T, d]."""
        return self.backbone(x, positions, attention, bufs)

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, d] -> float32 logits [N, 9, 1025] of the stored heads (guidance pads them after mixing)."""
        return torch.stack([head(hidden) for head in self.heads], dim=1).float()

"""A plain Llama decoder over a paged KV cache (flattened tokens, no padding between sequences).

Weights load from the transformers layout (`model.layers.N.self_attn.q_proj.weight`, ...);
q/k/v and gate/up are fused at load time so each layer runs two large matmuls instead of five.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vox_serve.layers.decoder import DecoderDims, DecoderLayer, RMSNorm, paged_attend, run_layers
from vox_serve.layers.rope import RotaryEmbedding, rope_parameters
from vox_serve.rt.attention import AttentionBackend, AttentionBuffers


@dataclass(frozen=True)
class LlamaConfig(DecoderDims):
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope: tuple[tuple[str, Any], ...]  # normalised rope parameters (hashable)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> LlamaConfig:
        return cls(
            **DecoderDims.fields_from_hf(cfg, default_eps=1e-5),
            max_position_embeddings=cfg.get("max_position_embeddings", 8192),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope=tuple(sorted(rope_parameters(cfg).items())),
        )


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.rms_norm_eps, i)
            for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(cfg.head_dim, max_positions, dict(cfg.rope))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
                bufs: AttentionBuffers) -> torch.Tensor:
        """input_ids [T], positions [T] -> final hidden states [T, hidden]."""
        x = self.embed_tokens(input_ids)
        return self.norm(*run_layers(self.layers, x, positions, self.rope, paged_attend(attn, bufs)))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab]."""
        return self.lm_head(hidden).float()

    def load_hf_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load transformers-named weights, fusing q/k/v and gate/up; raises on missing or extra keys."""
        pending: dict[str, torch.Tensor] = {}
        for name, tensor in tensors:
            name = name.removeprefix("model.")
            if name.startswith("rotary_emb"):
                continue
            pending[name] = tensor
        params = dict(self.named_parameters())
        loaded = set()
        with torch.no_grad():
            for i in range(self.cfg.num_layers):
                pre = f"layers.{i}."
                fused = {
                    "qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                    "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
                    "o_proj": ("self_attn.o_proj",),
                    "down_proj": ("mlp.down_proj",),
                }
                for ours, theirs in fused.items():
                    parts = [_take(pending, f"{pre}{t}.weight") for t in theirs]
                    params[f"{pre}{ours}.weight"].copy_(torch.cat(parts, dim=0))
                    loaded.add(f"{pre}{ours}.weight")
            for name in list(pending):
                if name in params:
                    params[name].copy_(pending.pop(name))
                    loaded.add(name)
        if "lm_head.weight" not in loaded and not self.cfg.tie_word_embeddings:
            raise ValueError("checkpoint has no lm_head.weight and does not tie word embeddings")
        loaded.add("lm_head.weight")
        missing = set(params) - loaded
        if missing or pending:
            raise ValueError(f"checkpoint mismatch: missing {sorted(missing)[:8]}, unexpected {sorted(pending)[:8]}")


def _take(pending: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in pending:
        raise ValueError(f"checkpoint is missing {name}")
    return pending.pop(name)

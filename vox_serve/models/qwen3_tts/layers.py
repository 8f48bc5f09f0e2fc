"""Qwen3-TTS networks: the talker (paged KV, flattened tokens) and the code predictor (static KV).

Both are Qwen3 decoders: RMSNorm on q and k per head, SwiGLU, no biases. The talker's rope is
M-RoPE with interleaved sections, but for text-to-speech its three position streams (temporal,
height, width) are all the token's sequence position (the reference's `get_rope_index` expands one
stream three times, prompt and decode alike), so every section rotates by the same angle and M-RoPE
is exactly 1D rope over the whole head. The code predictor (a `vox_serve.layers.depth.DepthTransformer`)
uses plain rope over positions 0..G-1 (G = code groups: the talker hidden, then one embedding per code group).

Codec embeddings: the talker's table (group 0 and control ids) and the predictor's tables (groups
1..G-1) live in one matrix `codec_tables` with per-group row offsets, so the input embedding of a
position, `sum_g table_g[id_g]`, is one gather; the predictor reads its inputs from the same matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.layers.decoder import Attend, DecoderDims, DecoderLayer, RMSNorm, run_layers
from vox_serve.layers.depth import DepthTransformer
from vox_serve.layers.rope import RotaryEmbedding, rope_parameters


@dataclass(frozen=True)
class DecoderConfig(DecoderDims):
    rope_theta: float

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> DecoderConfig:
        rope = rope_parameters(cfg)
        if rope["rope_type"] != "default":
            raise ValueError(f"Qwen3-TTS: rope_type {rope['rope_type']!r} is not supported (only 'default')")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Qwen3-TTS: hidden_act {cfg['hidden_act']!r} is not supported")
        if cfg.get("use_sliding_window") or cfg.get("attention_bias"):
            raise ValueError("Qwen3-TTS: sliding-window attention and attention biases are not supported")
        return cls(**DecoderDims.fields_from_hf(cfg, default_eps=1e-6), rope_theta=float(rope["rope_theta"]))


def decoder_layers(cfg: DecoderConfig) -> nn.ModuleList:
    """The Qwen3 decoder stack: shared layers with per-head q/k RMSNorm."""
    return nn.ModuleList(
        DecoderLayer(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                     cfg.rms_norm_eps, i, qk_norm=True)
        for i in range(cfg.num_layers)
    )


class Talker(nn.Module):
    """Text embedding + projection, the code-group embedding tables, the decoder and the codec head."""

    def __init__(self, cfg: DecoderConfig, text_vocab_size: int, text_hidden_size: int, predictor_vocab: int,
                 num_code_groups: int, max_positions: int) -> None:
        super().__init__()
        self.cfg, self.num_code_groups = cfg, num_code_groups
        self.text_embedding = nn.Embedding(text_vocab_size, text_hidden_size)
        self.text_fc1 = nn.Linear(text_hidden_size, text_hidden_size, bias=True)
        self.text_fc2 = nn.Linear(text_hidden_size, cfg.hidden_size, bias=True)
        sizes = [cfg.vocab_size] + [predictor_vocab] * (num_code_groups - 1)
        self.table_rows = [(sum(sizes[:g]), size) for g, size in enumerate(sizes)]  # (first row, rows) per group
        offsets = torch.tensor([start for start, _ in self.table_rows], dtype=torch.int64)
        self.register_buffer("table_offsets", offsets, persistent=False)
        self.codec_tables = nn.Parameter(torch.empty(sum(sizes), cfg.hidden_size))
        self.layers = decoder_layers(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = RotaryEmbedding(cfg.head_dim, max_positions, {"rope_type": "default", "rope_theta": cfg.rope_theta})

    def project_text(self, text_ids: Tensor) -> Tensor:
        """[N] text ids -> [N, hidden]: embedding, then the 2-layer SiLU projection."""
        return self.text_fc2(F.silu(self.text_fc1(self.text_embedding(text_ids))))

    def codec_embedding(self, group: int, ids: Tensor) -> Tensor:
        """Embeddings of code group `group` (0: the talker's own table, control ids included): a lookup in the
        group's rows of the matrix (a view), with no offset added on the device."""
        start, rows = self.table_rows[group]
        return F.embedding(ids, self.codec_tables[start : start + rows])

    def embed(self, ids: Tensor, tts_pad_id: int) -> Tensor:
        """ids [T, G + 1] (codes of groups 0..G-1, then the text id; -1 = absent) -> [T, hidden].

        An absent text id is tts_pad: generated frames carry no text (the prompt holds all of it).
        """
        g = self.num_code_groups
        text = ids[:, g]
        x = self.project_text(torch.where(text >= 0, text, tts_pad_id))
        codes = ids[:, :g]
        present = (codes >= 0).unsqueeze(-1)
        emb = F.embedding(codes.clamp(min=0) + self.table_offsets, self.codec_tables)  # [T, G, hidden]
        return x + torch.where(present, emb, 0.0).sum(dim=1)

    def forward(self, ids: Tensor, positions: Tensor, attend: Attend, tts_pad_id: int,
                added: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """ids [T, G + 1], positions [T] -> final hidden states [T, hidden]. `added` = (rows [E], vectors
        [E, hidden]): vectors summed into those positions' input embeddings (a speaker embedding)."""
        x = self.embed(ids, tts_pad_id)
        if added is not None:
            rows, vectors = added
            x = x.index_add(0, rows, vectors.to(x.dtype))
        return self.norm(*run_layers(self.layers, x, positions, self.rope, attend))


class CodePredictor(DepthTransformer):
    """Samples code groups 1..G-1 of a frame from the talker's hidden state and group-0 code (positions:
    the hidden state, then groups 0..G-2), with plain rope over positions 0..G-1."""

    def __init__(self, cfg: DecoderConfig, talker_hidden: int, num_code_groups: int) -> None:
        in_proj = (nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
                   if talker_hidden != cfg.hidden_size else nn.Identity())
        super().__init__(dims=cfg, in_proj=in_proj, num_positions=num_code_groups,
                         num_heads_out=num_code_groups - 1,
                         rope={"rope_type": "default", "rope_theta": cfg.rope_theta}, qk_norm=True)
        self.num_code_groups = num_code_groups

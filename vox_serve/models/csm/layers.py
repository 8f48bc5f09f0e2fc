"""CSM's networks: the backbone (paged KV, flattened tokens) and the depth decoder (static KV).

Input positions have `num_codebooks + 1` columns: codebooks 0..K-1, then the text id; -1 = absent. The
input embedding is the masked sum over the present columns: text positions carry only the text id
(`embed_text_tokens`), audio positions only their K codes (`embed_audio_tokens[code + vocab * k]`, summed),
as transformers' `CsmForConditionalGeneration` builds its prompt and decode inputs.

The backbone is a Llama decoder (rope from its config: llama3-scaled in the released model); the
`lm_head` predicts codebook 0 from the backbone's last hidden state after its final norm. The depth decoder
(`vox_serve.layers.depth.DepthTransformer`) starts afresh every frame: position 0 is that hidden state,
position p embeds code p - 1 with the backbone's audio table, all through `inputs_embeds_projector`; head
p - 1 (`codebooks_head`) predicts codebook p.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.layers.decoder import Attend, DecoderLayer, RMSNorm, run_layers
from vox_serve.layers.depth import DepthTransformer
from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.models.csm.config import CsmConfig


class CsmBackbone(nn.Module):
    def __init__(self, cfg: CsmConfig, max_positions: int) -> None:
        super().__init__()
        b = cfg.backbone
        self.num_codebooks, self.codebook_vocab = cfg.num_codebooks, cfg.codebook_vocab
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, b.hidden_size)
        self.audio_embedding = nn.Embedding(cfg.num_codebooks * cfg.codebook_vocab, b.hidden_size)
        self.register_buffer("audio_offsets", torch.arange(cfg.num_codebooks) * cfg.codebook_vocab, persistent=False)
        self.layers = nn.ModuleList(
            DecoderLayer(b.hidden_size, b.intermediate_size, b.num_heads, b.num_kv_heads, b.head_dim, b.rms_norm_eps, i)
            for i in range(b.num_layers))
        self.norm = RMSNorm(b.hidden_size, b.rms_norm_eps)
        self.lm_head = nn.Linear(b.hidden_size, cfg.codebook_vocab, bias=False)
        self.rope = RotaryEmbedding(b.head_dim, max_positions, dict(b.rope))

    def codebook_embedding(self, codebook: int, codes: Tensor) -> Tensor:
        """codes [N] of one codebook -> [N, hidden]."""
        return F.embedding(codes + codebook * self.codebook_vocab, self.audio_embedding.weight)

    def embed(self, ids: Tensor) -> Tensor:
        """ids [T, K + 1] (codebooks 0..K-1, then the text id; -1 = absent) -> [T, hidden]."""
        k = self.num_codebooks
        text = ids[:, k]
        x = torch.where((text >= 0)[:, None], self.text_embedding(text.clamp(min=0)), 0.0)
        codes = ids[:, :k]
        emb = F.embedding(codes.clamp(min=0) + self.audio_offsets, self.audio_embedding.weight)  # [T, K, hidden]
        return x + torch.where((codes >= 0)[..., None], emb, 0.0).sum(dim=1)

    def forward(self, ids: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        """ids [T, K + 1], positions [T] -> final hidden states [T, hidden] (after the final norm)."""
        return self.norm(*run_layers(self.layers, self.embed(ids), positions, self.rope, attend))


def depth_decoder(cfg: CsmConfig) -> DepthTransformer:
    """Positions 0..K-1 (the backbone hidden state, then codebooks 0..K-2); K-1 heads for codebooks 1..K-1."""
    return DepthTransformer(dims=cfg.depth, in_proj=nn.Linear(cfg.backbone.hidden_size, cfg.depth.hidden_size,
                                                              bias=False),
                            num_positions=cfg.num_codebooks, num_heads_out=cfg.num_codebooks - 1,
                            rope=dict(cfg.depth.rope), qk_norm=False)


def stop_rows(frames: Tensor, codebook_eos: int) -> Tensor:
    """frames [n, K] -> [n] bool: generation stops after a frame whose codebooks 0..K-2 are all eos (the last
    codebook is not looked at, as transformers' CSM generation does; the frame is kept)."""
    return frames[:, :-1].eq(codebook_eos).all(dim=-1)


def sample_frame(backbone: CsmBackbone, depth: DepthTransformer, hidden: Tensor,
                 sample: Callable[[Tensor, int], Tensor]) -> Tensor:
    """One frame per row from the backbone's last hidden states [n, hidden]: codebook 0 from `lm_head`, then
    codebooks 1..K-1 from the depth decoder. `sample(logits [n, vocab] float32, codebook) -> codes [n]`.
    Returns [n, K]."""
    first = sample(backbone.lm_head(hidden).float(), 0)
    return depth.sample_frame(hidden, first, backbone.codebook_embedding, sample)

"""Residual-VQ codebooks on the decode side: codes -> summed embeddings, each codebook's output projection
folded in at load time (Qwen3-TTS 12 Hz codec, Mimi)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

CLUSTER_USAGE_EPS = 1e-5  # the reference EuclideanCodebook's epsilon (not in config.json)


def codebook_vectors(embed_sum: Tensor, cluster_usage: Tensor) -> Tensor:
    """A Euclidean codebook's entries [K, dim] from its EMA statistics, as the references form them."""
    return embed_sum / cluster_usage.clamp(min=CLUSTER_USAGE_EPS)[:, None]


def projected_table(embed_sum: Tensor, cluster_usage: Tensor, output_proj: Tensor) -> Tensor:
    """One codebook with its group's 1x1 output projection [out, dim(, 1)] folded in: [K, out], in float64."""
    return codebook_vectors(embed_sum.double(), cluster_usage.double()) @ output_proj.double().flatten(1).T


class ProjectedCodebooks(nn.Module):
    """All codebooks with their output projections folded in: codes [B, N, Q] -> [B, dim, N]."""

    def __init__(self, num_quantizers: int, codebook_size: int, dim: int):
        super().__init__()
        self.codebook_size = codebook_size
        self.tables = nn.Parameter(torch.zeros(num_quantizers, codebook_size, dim))
        self.register_buffer("offsets", torch.arange(num_quantizers) * codebook_size, persistent=False)

    def forward(self, codes: Tensor) -> Tensor:
        # out-of-range codes are clamped rather than read out of bounds (references clamp -1 padding to 0)
        idx = codes.clamp(0, self.codebook_size - 1) + self.offsets
        emb = F.embedding(idx, self.tables.flatten(0, 1))  # [B, N, Q, dim]
        return emb.float().sum(dim=2).to(self.tables.dtype).transpose(1, 2)

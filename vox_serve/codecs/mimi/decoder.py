"""Mimi's decoder (codes -> 24 kHz audio), our own implementation, streaming through per-request state.

Architecture (transformers `MimiModel.decode`): the 32 codebooks (one semantic, 31 acoustic; each
`embed_sum / cluster_usage.clamp(1e-5)` behind its group's 1x1 output projection, folded into one table per
codebook at load time) summed -> x2 transposed conv (12.5 -> 25 Hz, grouped, no bias) -> transformer
(LayerNorm, rope, layer scale, GELU MLP; causal, each 25 Hz position sees the last `sliding_window`
positions, as transformers 5 and Kyutai's Mimi run it) -> SEANet decoder (causal convs, ELU, x8 x6 x5 x4
transposed convs, residual blocks). Every layer is causal, so T frames decode to exactly T * 1920 samples
and a stream of chunks (`vox_serve.codecs.slots.CodecSlots`) equals the one-shot decode.

Checkpoint keys: transformers' flat file layout (`upsample.*`, `decoder_transformer.layers.*`,
`decoder.layers.*`, `quantizer.*`; under `codec_model.` in a CSM checkpoint), which transformers 5 renames
in memory (`decoder.decoder_seanet.*`, ...).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from vox_serve.codecs.codebooks import ProjectedCodebooks, projected_table
from vox_serve.codecs.mimi.config import LATENT_STRIDE, MimiConfig
from vox_serve.codecs.mimi.layers import SeanetDecoder, TransformerLayer, random_weights
from vox_serve.codecs.streaming import (
    CausalUpConv,
    StatefulLayer,
    StreamingCodecDecoder,
    assign_state_ids,
    run_windowed,
    window_mask,
    window_rope,
)
from vox_serve.codecs.weight_norm import fuse_weight_norm

QUANTIZER_GROUPS = ("semantic_residual_vector_quantizer", "acoustic_residual_vector_quantizer")


class StreamingTransformer(StatefulLayer):
    """The decoder transformer; state: rotated keys/values of the previous window-1 positions,
    [layers, 2, kv heads, window - 1, head dim]."""

    def __init__(self, c: MimiConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(c) for _ in range(c.num_hidden_layers))
        self.window, self.cache_len = c.sliding_window, c.sliding_window - 1
        self.kv_heads, self.head_dim, self.rope_theta = c.num_key_value_heads, c.head_dim, c.rope_theta

    def state_shape(self) -> tuple[int, ...]:
        return (len(self.layers), 2, self.kv_heads, self.cache_len, self.head_dim)

    def forward(self, x: Tensor, states: list[Tensor], pos: Tensor) -> Tensor:
        """x [B, N, hidden] at 25 Hz positions pos[b] .. pos[b] + N - 1 -> [B, N, hidden]."""
        n = x.shape[1]
        rope = window_rope(pos, n, self.head_dim, self.rope_theta, x.dtype)
        mask = window_mask(pos, n, self.cache_len, self.window)
        h, states[self.state_id] = run_windowed(self.layers, x, states[self.state_id], rope, mask)
        return h


class MimiDecoder(StreamingCodecDecoder):
    """Codes [B, T, Q] -> audio [B, T * 1920]; `decode` for whole utterances, `CodecSlots` for streams."""

    def __init__(self, config: MimiConfig):
        super().__init__()
        c = self.config = config
        if c.pad_mode != "constant":
            raise ValueError(f"Mimi decoder: pad_mode {c.pad_mode!r} is not supported (only 'constant')")
        self.quantizer = ProjectedCodebooks(c.num_quantizers, c.codebook_size, c.hidden_size)
        self.upsample = CausalUpConv(c.hidden_size, c.hidden_size, 2 * LATENT_STRIDE, LATENT_STRIDE,
                                     groups=c.upsample_groups, bias=False)
        self.decoder_transformer = StreamingTransformer(c)
        self.decoder = SeanetDecoder(c)
        self.state_names, self.state_shapes = assign_state_ids(self)

    def forward_chunk(self, codes: Tensor, states: list[Tensor], pos: Tensor) -> Tensor:
        """codes [B, N, Q] of frames pos[b] .. pos[b]+N-1 -> pcm [B, N * samples_per_frame] (unclamped).

        `states` (per `state_shapes`, batch first) is read and its entries replaced by the new state.
        Static shapes, no host synchronisation.
        """
        if codes.shape[-1] != self.config.num_quantizers:
            raise ValueError(f"expected {self.config.num_quantizers} codebooks per frame, got {codes.shape[-1]}")
        h = self.upsample(self.quantizer(codes), states)  # [B, hidden, 2N]
        h = self.decoder_transformer(h.transpose(1, 2), states, pos * LATENT_STRIDE).transpose(1, 2)
        return self.decoder(h, states)[:, 0]

    def load_checkpoint(self, sd: dict[str, Tensor], source: str) -> set[str]:
        """Load Mimi's decoder weights from file-layout keys (prefix removed; any weight-norm layout).

        Returns the keys it used (the encoder's are left for the caller); raises naming the missing keys
        or mismatched shapes.
        """
        used = {k for k in sd if k.split(".")[0] in ("upsample", "decoder_transformer", "decoder")}
        values = fuse_weight_norm({k: sd[k] for k in used})
        tables, codebook_keys = fold_codebooks(sd, self.config, source)
        values["quantizer.tables"] = tables
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(values)), sorted(set(values) - set(own))
        bad = [f"{k}: {tuple(v.shape)} != {tuple(own[k].shape)}" for k, v in values.items()
               if k in own and v.shape != own[k].shape]
        if missing or unexpected or bad:
            raise ValueError(f"Mimi decoder {source}: missing weights {missing[:8]}; unexpected {unexpected[:8]}; "
                             f"shape mismatches {bad[:8]}")
        self.load_state_dict(values)
        return used | codebook_keys

    @classmethod
    def random(cls, config: MimiConfig, seed: int, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> MimiDecoder:
        """Random weights of the checkpoint's shapes (`--load-format dummy`); deterministic per seed. The sum
        over the codebooks has unit scale."""
        model = cls(config)
        random_weights(model, config, seed, table_std=1 / math.sqrt(config.num_quantizers))
        return model.to(device=device, dtype=dtype).eval()


def fold_codebooks(sd: dict[str, Tensor], c: MimiConfig, source: str) -> tuple[Tensor, set[str]]:
    """The split RVQ (codebook 0: the semantic group, 1..: the acoustic group) -> tables [Q, K, hidden]
    in float32, formed in float64; and the keys read (codebook statistics, output projections)."""
    tables, missing, used = [], [], set()
    for q in range(c.num_quantizers):
        semantic = q < c.num_semantic_quantizers
        group, layer = QUANTIZER_GROUPS[0 if semantic else 1], q if semantic else q - c.num_semantic_quantizers
        prefix = f"quantizer.{group}."
        names = [f"{prefix}layers.{layer}.codebook.embed_sum", f"{prefix}layers.{layer}.codebook.cluster_usage"]
        proj_key = f"{prefix}output_proj.weight"
        proj = sd.get(proj_key)
        if proj is None and c.vector_quantization_hidden_dimension == c.hidden_size:
            proj = torch.eye(c.hidden_size)  # no projection: the codebook lives in the latent space itself
        if proj is None or any(n not in sd for n in names):
            missing += [n for n in names if n not in sd] + ([proj_key] if proj is None else [])
            continue
        tables.append(projected_table(sd[names[0]], sd[names[1]], proj))
        used.update(n for n in (*names, proj_key, f"{prefix}layers.{layer}.codebook.initialized") if n in sd)
    if missing:
        raise ValueError(f"Mimi decoder {source}: missing codebook weights {sorted(set(missing))[:8]}")
    return torch.stack(tables).float(), used

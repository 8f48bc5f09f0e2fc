"""Mimi's encoder (24 kHz audio -> codes [frames, codebooks]), for reference / context audio given as a clip.

Used by CSM (context turns' audio) and by Qwen3-TTS Base (its 12 Hz tokenizer's encoder is a Mimi; the
`encoder.*` half of `speech_tokenizer/`). A SEANet convolution stack (causal convolutions, ELU, residual
blocks, strided downsampling to 25 Hz), a transformer (`vox_serve.codecs.mimi.layers.TransformerLayer`), a
stride-2 convolution to 12.5 Hz, then a split residual vector quantizer: the first ("semantic") codebook
quantizes one projection of the frame, the remaining ("acoustic") codebooks a residual chain over another
projection of the same frame. Only the first `num_codebooks` are computed (Qwen3-TTS keeps 16 of 32).

The transformer attends causally over the whole clip, within `attention_window` 25 Hz positions when one
is given: transformers 5 applies the config's `sliding_window` (CSM's reference), transformers 4.57 does
not (Qwen3-TTS's reference). The codes of a clip of n samples are its first ceil(n / 1920) frames. It runs
once per request, off the per-step path, in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.codecs.codebooks import codebook_vectors
from vox_serve.codecs.mimi.config import LATENT_STRIDE, MimiConfig
from vox_serve.codecs.mimi.layers import TransformerLayer, random_weights
from vox_serve.codecs.streaming import run_windowed, window_mask
from vox_serve.codecs.weight_norm import fuse_weight_norm
from vox_serve.layers.rope import RotaryEmbedding

QUANTIZER_GROUPS = ("semantic", "acoustic")


class PaddedConv(nn.Module):
    """Conv1d padded on the left by kernel - stride, and on the right just enough for a whole last step."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 pad_mode: str = "constant") -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.stride, self.pad_mode = stride, pad_mode
        self.effective_kernel = (kernel - 1) * dilation + 1

    def forward(self, x: Tensor) -> Tensor:
        left = self.effective_kernel - self.stride
        steps = math.ceil((x.shape[-1] - self.effective_kernel + left) / self.stride + 1) - 1
        right = steps * self.stride + self.effective_kernel - left - x.shape[-1]
        return self.conv(F.pad(x, (left, right), mode=self.pad_mode))


class ResnetBlock(nn.Module):
    def __init__(self, dim: int, hidden: int, kernel: int, dilation: int, pad_mode: str) -> None:
        super().__init__()
        # Indices 1 and 3 hold the convolutions (0 and 2 are ELUs), as in the checkpoint's key names.
        self.block = nn.ModuleList([nn.ELU(), PaddedConv(dim, hidden, kernel, dilation=dilation, pad_mode=pad_mode),
                                    nn.ELU(), PaddedConv(hidden, dim, 1, pad_mode=pad_mode)])

    def forward(self, x: Tensor) -> Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


class SeanetEncoder(nn.Module):
    """audio [B, 1, n] -> [B, hidden, n / hop_length]; layer indices as in the checkpoint."""

    def __init__(self, c: MimiConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [PaddedConv(1, c.num_filters, c.kernel_size, pad_mode=c.pad_mode)]
        width = c.num_filters
        for ratio in reversed(c.upsampling_ratios):
            layers += [ResnetBlock(width, width // c.compress, c.residual_kernel_size, c.dilation_growth_rate**j,
                                   c.pad_mode) for j in range(c.num_residual_layers)]
            layers += [nn.ELU(), PaddedConv(width, width * 2, ratio * 2, stride=ratio, pad_mode=c.pad_mode)]
            width *= 2
        layers += [nn.ELU(), PaddedConv(width, c.hidden_size, c.last_kernel_size, pad_mode=c.pad_mode)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class ClipTransformer(nn.Module):
    """The encoder transformer over one whole clip [T, hidden] (rope from the reference's float32 table)."""

    def __init__(self, c: MimiConfig, window: int | None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(c) for _ in range(c.num_hidden_layers))
        self.rope = RotaryEmbedding(c.head_dim, c.max_position_embeddings,
                                    {"rope_type": "default", "rope_theta": c.rope_theta})
        self.window, self.kv_heads, self.head_dim = window, c.num_key_value_heads, c.head_dim

    def forward(self, h: Tensor) -> Tensor:
        t = h.shape[0]
        rope = (self.rope.cos[:t].to(h.dtype)[None, None], self.rope.sin[:t].to(h.dtype)[None, None])
        start = torch.zeros(1, dtype=torch.int64, device=h.device)
        no_cache = h.new_zeros(1, len(self.layers), 2, self.kv_heads, 0, self.head_dim)
        out, _ = run_windowed(self.layers, h[None], no_cache, rope, window_mask(start, t, 0, self.window))
        return out[0]


class Codebooks(nn.Module):
    """A residual chain of nearest-neighbour codebooks behind a 1x1 input projection."""

    def __init__(self, c: MimiConfig, num_codebooks: int) -> None:
        super().__init__()
        dim = c.vector_quantization_hidden_dimension
        self.input_proj = nn.Conv1d(c.hidden_size, dim, 1, bias=False) if dim != c.hidden_size else None
        self.tables = nn.Parameter(torch.zeros(num_codebooks, c.codebook_size, dim))

    def forward(self, x: Tensor) -> Tensor:
        """x [hidden, frames] -> codes [frames, num_codebooks]."""
        residual = (self.input_proj(x[None])[0] if self.input_proj is not None else x).t()
        codes = []
        for table in self.tables:
            index = torch.cdist(residual[None], table[None])[0].argmin(dim=-1)
            residual = residual - table[index]
            codes.append(index)
        return torch.stack(codes, dim=1)


class MimiEncoder(nn.Module):
    """24 kHz audio [samples] -> codes [ceil(samples / 1920), num_codebooks] int64."""

    def __init__(self, config: MimiConfig, num_codebooks: int | None = None, attention_window: int | None = None
                 ) -> None:
        super().__init__()
        c = self.config = config
        self.num_codebooks = num_codebooks or c.num_quantizers
        if not c.num_semantic_quantizers < self.num_codebooks <= c.num_quantizers:
            raise ValueError(f"Mimi encoder: {self.num_codebooks} codebooks of {c.num_quantizers} "
                             f"({c.num_semantic_quantizers} semantic) is not supported")
        self.encoder = SeanetEncoder(c)
        self.encoder_transformer = ClipTransformer(c, attention_window)
        self.downsample = PaddedConv(c.hidden_size, c.hidden_size, 2 * LATENT_STRIDE, stride=LATENT_STRIDE,
                                     bias=False, pad_mode="replicate")
        self.semantic = Codebooks(c, c.num_semantic_quantizers)
        self.acoustic = Codebooks(c, self.num_codebooks - c.num_semantic_quantizers)

    @property
    def max_samples(self) -> int:
        """The longest clip the transformer's rope table covers (25 Hz before downsampling)."""
        return self.config.max_position_embeddings * self.config.hop_length

    @torch.no_grad()
    def forward(self, audio: Tensor) -> Tensor:
        if audio.shape[-1] > self.max_samples:
            raise ValueError(f"a clip of {audio.shape[-1]} samples is longer than the encoder's "
                             f"{self.max_samples} ({self.config.max_position_embeddings} positions)")
        w = self.semantic.tables
        x = self.encoder(audio.to(w.device, w.dtype)[None, None])
        h = self.encoder_transformer(x[0].t())  # [frames at 25 Hz, hidden]
        x = self.downsample(h.t()[None])[0]  # [hidden, frames at 12.5 Hz]
        codes = torch.cat([self.semantic(x), self.acoustic(x)], dim=1)
        return codes[: -(-audio.shape[-1] // self.config.samples_per_frame)]

    def load_checkpoint(self, sd: dict[str, Tensor], source: str) -> set[str]:
        """Load the encoder half of Mimi's file-layout keys (prefix removed; any weight-norm layout).

        Returns the keys it used (the decoder's are left for the caller); raises on missing weights.
        """
        used = {k for k in sd if k.split(".")[0] in ("encoder", "encoder_transformer", "downsample")}
        values = fuse_weight_norm({k: sd[k] for k in used})
        c = self.config
        for group, count in zip(QUANTIZER_GROUPS, (c.num_semantic_quantizers,
                                                   self.num_codebooks - c.num_semantic_quantizers), strict=True):
            prefix = f"quantizer.{group}_residual_vector_quantizer."
            if f"{prefix}input_proj.weight" in sd:
                values[f"{group}.input_proj.weight"] = sd[f"{prefix}input_proj.weight"]
                used.add(f"{prefix}input_proj.weight")
            names = [(f"{prefix}layers.{i}.codebook.embed_sum", f"{prefix}layers.{i}.codebook.cluster_usage")
                     for i in range(count)]
            missing = [n for pair in names for n in pair if n not in sd]
            if missing:
                raise ValueError(f"Mimi encoder {source}: missing weights {missing[:8]}")
            # As the reference forms its codebooks: embed_sum / usage in the checkpoint's dtype.
            values[f"{group}.tables"] = torch.stack([codebook_vectors(sd[s], sd[u]) for s, u in names])
            used.update(n for pair in names for n in pair)
        own = self.state_dict()
        missing = sorted(set(own) - set(values))
        bad = [f"{k}: {tuple(v.shape)} != {tuple(own[k].shape)}" for k, v in values.items()
               if k in own and v.shape != own[k].shape]
        unexpected = sorted(set(values) - set(own))
        if missing or bad or unexpected:
            raise ValueError(f"Mimi encoder {source}: missing weights {missing[:8]}; unexpected {unexpected[:8]}; "
                             f"shape mismatches {bad[:8]}")
        self.load_state_dict(values)
        return used

    @classmethod
    def random(cls, config: MimiConfig, seed: int, device: torch.device | str = "cpu", **kwargs: int | None
               ) -> MimiEncoder:
        """Random weights of the checkpoint's shapes (`--load-format dummy`); deterministic per seed.
        `kwargs`: the constructor's (num_codebooks, attention_window)."""
        model = cls(config, **kwargs)
        random_weights(model, config, seed, table_std=1.0)
        return model.to(device).eval()

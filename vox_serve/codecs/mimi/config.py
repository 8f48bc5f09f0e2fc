"""Mimi's geometry, from a transformers `MimiConfig` as config.json files hold it (both rope dialects)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from vox_serve.layers.rope import rope_parameters

LATENT_STRIDE = 2  # the 25 Hz SEANet latents are down/upsampled x2 around the 12.5 Hz codes
# Settings the transformers config can take that this implementation does not cover (key -> the one value).
FIXED = {"use_causal_conv": True, "use_conv_shortcut": False, "hidden_act": "gelu", "audio_channels": 1,
         "trim_right_ratio": 1.0}


@dataclass(frozen=True)
class MimiConfig:
    """Defaults: transformers' `MimiConfig` defaults (the kyutai/mimi geometry); a config.json always wins."""

    sampling_rate: int = 24000
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    compress: int = 2
    pad_mode: str = "constant"
    codebook_size: int = 2048
    codebook_dim: int = 256
    vector_quantization_hidden_dimension: int = 256
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    upsample_groups: int = 512
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8000
    sliding_window: int = 250
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MimiConfig:
        """From a Mimi config dict (transformers 4.x `rope_theta` or 5.x `rope_parameters`)."""
        for key, want in FIXED.items():
            if d.get(key, want) != want:
                raise ValueError(f"Mimi config: {key}={d[key]!r} is not supported (only {want!r})")
        rope = rope_parameters(d)
        if rope["rope_type"] != "default":
            raise ValueError(f"Mimi config: rope_type {rope['rope_type']!r} is not supported (only 'default')")
        names = {f.name for f in fields(cls)} - {"head_dim", "rope_theta"}
        kw = {k: tuple(d[k]) if isinstance(d[k], list) else d[k] for k in names if d.get(k) is not None}
        hidden = d.get("hidden_size", cls.hidden_size)
        heads = d.get("num_attention_heads", cls.num_attention_heads)
        cfg = cls(**kw, head_dim=d.get("head_dim") or hidden // heads, rope_theta=float(rope["rope_theta"]))
        frame_rate = d.get("frame_rate", d.get("_frame_rate"))
        if frame_rate is not None and not math.isclose(frame_rate, cfg.frame_rate):
            raise ValueError(f"Mimi config: frame_rate {frame_rate} != {cfg.frame_rate} of its strides")
        return cfg

    @property
    def hop_length(self) -> int:
        """Samples per 25 Hz SEANet latent."""
        return math.prod(self.upsampling_ratios)

    @property
    def samples_per_frame(self) -> int:
        """Samples per code frame (1920 for the real Mimi: 12.5 Hz at 24 kHz)."""
        return self.hop_length * LATENT_STRIDE

    @property
    def frame_rate(self) -> float:
        return self.sampling_rate / self.samples_per_frame

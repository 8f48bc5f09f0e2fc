"""Rotary position embeddings, with the rope dialects of transformers 4.x and 5.x config files."""

from __future__ import annotations

import math
from typing import Any

import torch

from vox_serve.rt import triton_ops


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """Normalise `rope_theta` + `rope_scaling` (transformers 4.x) and `rope_parameters` (5.x).

    Returns a dict with at least `rope_type` and `rope_theta`.
    """
    params: dict[str, Any] = {}
    if isinstance(config.get("rope_parameters"), dict):
        params.update(config["rope_parameters"])
    if isinstance(config.get("rope_scaling"), dict):
        params.update(config["rope_scaling"])
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    return params


def inverse_frequencies(head_dim: int, params: dict[str, Any]) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies, with llama3 scaling when configured.

    float32 throughout, as the reference computes them: the model was trained with these values.
    """
    theta = float(params["rope_theta"])
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = params["rope_type"]
    if kind == "default":
        return inv
    if kind != "llama3":
        raise ValueError(f"unsupported rope_type {kind!r} (supported: default, llama3)")
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_len = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    """cos/sin tables for positions [0, max_positions).

    Rotate-half convention by default (Llama, Qwen: dims i and i + D/2 form a pair); `interleaved`
    pairs dims 2i and 2i + 1 instead (gpt-fast style, Zonos), with the same frequency per pair.
    """

    def __init__(self, head_dim: int, max_positions: int, params: dict[str, Any], interleaved: bool = False) -> None:
        super().__init__()
        inv = inverse_frequencies(head_dim, params)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv.float())
        emb = angles.repeat_interleave(2, dim=-1) if interleaved else torch.cat([angles, angles], dim=-1)
        self.interleaved = interleaved
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q [T, Hq, D], k [T, Hk, D], positions [T] -> rotated (q, k) in the input dtype."""
        if triton_ops.enabled(q) and not self.interleaved:
            return triton_ops.rope(q, self.cos, self.sin, positions), triton_ops.rope(k, self.cos, self.sin, positions)
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        rotate = _rotate_interleaved if self.interleaved else _rotate
        return rotate(q, cos, sin), rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def _rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairs (x[2i], x[2i+1]) -> (x0 cos - x1 sin, x1 cos + x0 sin); cos/sin hold each angle twice."""
    xf = x.float()
    pairs = xf.unflatten(-1, (-1, 2))
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return (xf * cos + rotated * sin).to(x.dtype)

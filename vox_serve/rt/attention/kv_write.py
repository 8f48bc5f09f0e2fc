"""Writing a layer's new K/V into a cache, with the q/k preparation before it (per-head norm, rope).

The decoder layers hand attention their q and k as the qkv projection produced them, with a `QKPrep`
saying how to prepare them; `write_kv` prepares them and writes k and v at the tokens' slots. On GPUs
(Triton) that is one kernel per layer (`triton_ops.rope_write_kv`) instead of up to nine; elsewhere the
layer's own modules run as before, then the indexed writes.

The norm and rope are the layer's modules (`layers/`), typed here by what this module needs of them.

The cache may be narrower than the model (`--kv-cache-dtype fp8`: float8 e4m3, half the bytes of bfloat16 per
token). Values are stored unscaled (a scale of 1, as uncalibrated vLLM does), saturated at +-448, its largest
finite value; readers convert them back to the query's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from vox_serve.config import KV_CACHE_DTYPES
from vox_serve.rt import triton_ops

FP8 = triton_ops.FP8
FP8_MAX = 448.0


def kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache dtype `--kv-cache-dtype name` means for a model of model_dtype."""
    if name == "auto":
        return model_dtype
    if name == "fp8":
        return FP8
    raise ValueError(f"--kv-cache-dtype {name!r}: use one of {', '.join(KV_CACHE_DTYPES)}")


def to_cache(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x as stored in a cache of dtype: a float8 cache saturates at +-FP8_MAX instead of overflowing to NaN."""
    if dtype == FP8:
        x = x.float().clamp(-FP8_MAX, FP8_MAX)
    return x.to(dtype)


class HeadNorm(Protocol):
    """An RMSNorm over each head's dim (Qwen3's q_norm / k_norm)."""

    weight: Tensor  # [D]
    eps: float

    def __call__(self, x: Tensor) -> Tensor: ...


class Rope(Protocol):
    """Rotary embedding tables and the reference rotation of q and k."""

    cos: Tensor  # [P, D] float32
    sin: Tensor
    interleaved: bool  # pairs (2i, 2i + 1) instead of (i, i + D/2): not fused

    def __call__(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, ...]: ...


@dataclass(frozen=True)
class QKPrep:
    """What happens to q and k between the qkv projection and attention: per-head norms, then rope."""

    rope: Rope
    positions: Tensor  # [T] the tokens' positions
    q_norm: HeadNorm | None = None  # both or neither
    k_norm: HeadNorm | None = None

    def apply(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """The reference: q [T, Hq, D], k [T, Hkv, D] -> prepared (q, k)."""
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rope(q, k, self.positions)
        return q, k

    def kernel_args(self) -> dict[str, Any] | None:
        """The fused kernel's keyword arguments, or None where it does not do this preparation."""
        if self.rope.interleaved:
            return None
        args: dict[str, Any] = dict(cos=self.rope.cos, sin=self.rope.sin, positions=self.positions)
        if self.q_norm is None or self.k_norm is None:
            return args
        if self.q_norm.eps != self.k_norm.eps:
            return None
        return {**args, "q_norm": self.q_norm.weight, "k_norm": self.k_norm.weight, "eps": self.q_norm.eps}


def write_kv(k_cache: Tensor, v_cache: Tensor, q: Tensor, k: Tensor, v: Tensor, slots: Tensor,
             prep: QKPrep | None) -> Tensor:
    """Prepare q and k by `prep` (none: they come prepared) and write k, v at `slots`; returns q, prepared.

    k_cache, v_cache [pages, page_size, Hkv, D] (views; page = slot // page_size, offset = slot % page_size);
    q [T, Hq, D]; k, v [T, Hkv, D]; slots [T] int64."""
    if triton_ops.enabled(q):
        args = {} if prep is None else prep.kernel_args()
        if args is not None:
            return triton_ops.rope_write_kv(q, k, v, k_cache, v_cache, slots, **args)
    if prep is not None:
        q, k = prep.apply(q, k)
    page_size = k_cache.shape[1]
    page, offset = slots // page_size, slots % page_size
    k_cache[page, offset] = to_cache(k, k_cache.dtype)
    v_cache[page, offset] = to_cache(v, v_cache.dtype)
    return q

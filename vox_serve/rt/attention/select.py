"""Choosing the attention backend: FlashInfer where it can serve the configuration, PyTorch otherwise."""

from __future__ import annotations

from typing import Any

import torch

from vox_serve.rt.attention.base import AttentionBackend
from vox_serve.rt.attention.torch_backend import TorchAttentionBackend


def flashinfer_available() -> bool:
    """True when flashinfer imports (an installed but broken build counts as unavailable)."""
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


def flashinfer_unsupported(**kwargs: Any) -> str | None:
    """Why FlashInfer cannot serve this configuration (None when it can)."""
    if torch.device(kwargs.get("device", "cpu")).type != "cuda":
        return "it needs a CUDA device"
    if kwargs.get("dtype") not in (torch.float16, torch.bfloat16):
        return f"it needs float16 or bfloat16, not {kwargs.get('dtype')}"
    if kwargs.get("head_dim") not in (64, 128, 256):
        return f"head_dim {kwargs.get('head_dim')} is not one of 64, 128, 256"
    if not flashinfer_available():
        return "the flashinfer-python package is not installed (or does not import)"
    return None


def make_attention_backend(name: str, **kwargs: Any) -> AttentionBackend:
    """Build the attention backend called `name` ("torch", "flashinfer" or "auto")."""
    if name == "auto":
        name = "flashinfer" if flashinfer_unsupported(**kwargs) is None else "torch"
    if name == "torch":
        return TorchAttentionBackend(**kwargs)
    if name == "flashinfer":
        why = flashinfer_unsupported(**kwargs)
        if why is not None:
            raise RuntimeError(f"flashinfer backend not available: {why}")
        from vox_serve.rt.attention.flashinfer_backend import FlashInferAttentionBackend

        return FlashInferAttentionBackend(**kwargs)
    raise ValueError(f"unknown attention backend {name!r}; expected 'torch', 'flashinfer' or 'auto'")

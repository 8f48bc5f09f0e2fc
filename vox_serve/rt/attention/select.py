"""Choosing the attention backend: FlashInfer where it can serve the configuration, PyTorch otherwise; for a
float8 KV cache (which FlashInfer's modules here do not read) the planless Triton kernels on a GPU."""

from __future__ import annotations

from typing import Any

import torch

from vox_serve.rt.attention.base import AttentionBackend
from vox_serve.rt.attention.torch_backend import TorchAttentionBackend
from vox_serve.rt.attention.triton_backend import TritonAttentionBackend, triton_unsupported


def flashinfer_available() -> bool:
    """True when flashinfer imports (an installed but broken build counts as unavailable)."""
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


def flashinfer_unsupported(**kwargs: Any) -> str | None:
    """Why FlashInfer cannot serve this configuration (None when it can)."""
    kv_dtype = kwargs.get("kv_dtype")
    if kv_dtype is not None and kv_dtype != kwargs.get("dtype"):
        return f"it reads a KV cache in the model's dtype here, not {kv_dtype} (the triton backend reads float8)"
    if torch.device(kwargs.get("device", "cpu")).type != "cuda":
        return "it needs a CUDA device"
    if kwargs.get("dtype") not in (torch.float16, torch.bfloat16):
        return f"it needs float16 or bfloat16, not {kwargs.get('dtype')}"
    if kwargs.get("head_dim") not in (64, 128, 256):
        return f"head_dim {kwargs.get('head_dim')} is not one of 64, 128, 256"
    if not flashinfer_available():
        return "the flashinfer-python package is not installed (or does not import)"
    return None


def auto_backend(**kwargs: Any) -> str:
    """What `auto` picks: FlashInfer where it serves the configuration, else Triton where a float8 cache needs it
    and it serves, else PyTorch."""
    if flashinfer_unsupported(**kwargs) is None:
        return "flashinfer"
    narrow = kwargs.get("kv_dtype") not in (None, kwargs.get("dtype"))
    return "triton" if narrow and triton_unsupported(**kwargs) is None else "torch"


def make_attention_backend(name: str, **kwargs: Any) -> AttentionBackend:
    """Build the attention backend called `name` ("torch", "flashinfer", "triton" or "auto")."""
    if name == "auto":
        name = auto_backend(**kwargs)
    if name == "torch":
        return TorchAttentionBackend(**kwargs)
    if name == "triton":
        why = triton_unsupported(**kwargs)
        if why is not None:
            raise RuntimeError(f"triton attention backend not available: {why}")
        return TritonAttentionBackend(**kwargs)
    if name == "flashinfer":
        why = flashinfer_unsupported(**kwargs)
        if why is not None:
            raise RuntimeError(f"flashinfer backend not available: {why}")
        from vox_serve.rt.attention.flashinfer_backend import FlashInferAttentionBackend

        return FlashInferAttentionBackend(**kwargs)
    raise ValueError(f"unknown attention backend {name!r}; expected 'torch', 'flashinfer', 'triton' or 'auto'")

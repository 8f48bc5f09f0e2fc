"""Choosing the attention backend: FlashInfer where it can serve the configuration, PyTorch otherwise; for a
float8 KV cache on a GPU the one FP8_BACKEND names (both FlashInfer, through its e4m3 modules, and the planless
Triton kernels read one)."""

from __future__ import annotations

from typing import Any

import torch

from vox_serve.rt.attention.base import AttentionBackend
from vox_serve.rt.attention.kv_write import FP8
from vox_serve.rt.attention.torch_backend import TorchAttentionBackend
from vox_serve.rt.attention.triton_backend import TritonAttentionBackend, triton_unsupported


def flashinfer_available() -> bool:
    """True when flashinfer imports (an installed but broken build counts as unavailable)."""
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


# What `auto` picks for a float8 cache on a GPU: on an H100, Orpheus offline (256 at once) ran 272.2x real time
# on the triton backend and 247.1x on FlashInfer's e4m3 modules (benchmark/results/h100-2026-12-07c).
FP8_BACKEND = "triton"


def flashinfer_unsupported(**kwargs: Any) -> str | None:
    """Why FlashInfer cannot serve this configuration (None when it can). A float8 cache is read by its e4m3
    modules (the tensor-core decode and the prefill on its fa2 kernels: fa3 reads float8 only with float8
    queries), compiled on first use unless carried prebuilt."""
    kv_dtype = kwargs.get("kv_dtype")
    if kv_dtype not in (None, kwargs.get("dtype"), FP8):
        return f"it reads a KV cache in the model's dtype or in float8 e4m3, not {kv_dtype}"
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
    """What `auto` picks: for a float8 cache FP8_BACKEND where it serves; else FlashInfer where it serves the
    configuration, else Triton where a float8 cache needs it and it serves, else PyTorch."""
    narrow = kwargs.get("kv_dtype") not in (None, kwargs.get("dtype"))
    unsupported = {"flashinfer": flashinfer_unsupported, "triton": triton_unsupported}
    if narrow and unsupported[FP8_BACKEND](**kwargs) is None:
        return FP8_BACKEND
    if flashinfer_unsupported(**kwargs) is None:
        return "flashinfer"
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

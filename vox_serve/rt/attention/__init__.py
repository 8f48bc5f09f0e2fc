"""Paged attention: the interface the models call (`base`), the PyTorch reference backend, FlashInfer's, the
planless Triton one, and the choice between them. Every backend shares FlashInfer's NHD paged KV layout."""

from vox_serve.rt.attention.base import AttentionBackend, AttentionBuffers, AttentionPlan, PlanInputs, paged_kv_offsets
from vox_serve.rt.attention.select import flashinfer_available, flashinfer_unsupported, make_attention_backend
from vox_serve.rt.attention.torch_backend import TorchAttentionBackend

__all__ = ["AttentionBackend", "AttentionBuffers", "AttentionPlan", "PlanInputs", "TorchAttentionBackend",
           "flashinfer_available", "flashinfer_unsupported", "make_attention_backend", "paged_kv_offsets"]

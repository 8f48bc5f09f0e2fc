"""Decode attention through FlashInfer's XQA kernel (TensorRT-LLM's decode for grouped queries; Hopper and later),
off by default: `VOX_XQA_DECODE=1` serves every decode bucket that rt/attention/triton_decode does not, for A/B
measurements against FlashInfer's planned decode (benchmark/decode_attention.py times it per shape).

It reads what the stage already holds on the device, the rows' page tables (the block tables) and KV lengths, over
the same paged cache [P, 2, page, Hkv, D] (NHD), so like the Triton kernel it needs no host plan; its workspace
(semaphores first, zeroed once) is shared by every layer and bucket, as the launches run one after another on one
stream. FlashInfer's wrappers are still planned for those buckets (the planner layout the runtimes read is
unchanged); the captured graph just does not read that plan.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

ENV = "VOX_XQA_DECODE"
WORKSPACE_BYTES = 256 << 20  # its first 8 MiB are the semaphores
PAGE_SIZES = (16, 32, 64, 128)


def enabled() -> bool:
    """VOX_XQA_DECODE: 0 (the default) or 1."""
    value = os.environ.get(ENV, "0").strip() or "0"
    if value not in ("0", "1"):
        raise ValueError(f"{ENV}={value!r}: use 0 (the default) or 1")
    return value == "1"


def serves(q: Tensor, cache: Tensor) -> bool:
    """Whether a decode launch of q [rows, Hq, D] over `cache` [P, 2, page, Hkv, D] runs here: enabled, bfloat16 on a
    GPU of compute capability 9, 10 or 12, a page size and head dim the kernel is built for, GQA heads."""
    if not (enabled() and q.is_cuda and q.dtype == torch.bfloat16 and cache.dtype == q.dtype):
        return False
    if torch.cuda.get_device_capability(q.device)[0] not in (9, 10, 12):
        return False
    hq, d = q.shape[1], q.shape[2]
    page, hkv = cache.shape[2], cache.shape[3]
    return page in PAGE_SIZES and d % 16 == 0 and d <= 256 and hq % hkv == 0 and cache.is_contiguous()


def workspace(device: torch.device) -> Tensor:
    return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)


def decode_attention(q: Tensor, cache: Tensor, page_table: Tensor, kv_lens: Tensor, scale: float,
                     work: Tensor) -> Tensor:
    """q [T, Hq, D] attending to its row's first kv_lens[t] tokens (page_table [T, C] int32, kv_lens [T] int32)
    -> [T, Hq, D]."""
    import flashinfer

    return flashinfer.decode.xqa_batch_decode_with_kv_cache(
        q.contiguous(), cache, work, page_table, kv_lens.view(torch.uint32), page_table.shape[1] * cache.shape[2],
        bmm1_scale=scale, bmm2_scale=1.0, kv_layout="NHD")

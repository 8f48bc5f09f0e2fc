"""The Rust extension's CUDA sampling kernels (rust/kernels/sampling.cu) as tensor functions.

They compute what `rt.kernels` (the reference) computes: the counter-hash uniforms bit for bit,
and the sampler's filters and exponential race over them. Launches go to PyTorch's current
stream as raw pointers, so they run inside a CUDA-graph capture like any PyTorch kernel; the
kernels are loaded into the device's context on first use (warm-up), never during a capture.

`enabled(t)`: CUDA tensors, when `vox_serve._rt` imports with embedded kernels that load on
`t`'s device; `VOX_RUST_KERNELS=0` turns them off (the Triton kernels then serve, as without the
extension). A device where they fail to load is reported once and falls back.
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import Tensor

try:
    from vox_serve import _rt
except ImportError:  # the extension is optional (built only with cargo)
    _rt = None

MAX_SAMPLE_VOCAB = 8192 if _rt is None else int(_rt.MAX_SAMPLE_VOCAB)
_ready: dict[int, bool] = {}


def available() -> bool:
    """Whether this install has the kernels at all (extension built with nvcc), and they are not
    switched off."""
    return _rt is not None and _rt.kernels_embedded() and os.environ.get("VOX_RUST_KERNELS", "1") != "0"


def enabled(t: Tensor) -> bool:
    if not t.is_cuda or not available():
        return False
    device = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if device not in _ready:
        try:
            _rt.load_kernels(device)
            _ready[device] = True
        except RuntimeError as exc:
            warnings.warn(f"vox_serve._rt's sampling kernels do not load on cuda:{device} ({exc}); "
                          "using the Triton / PyTorch kernels", stacklevel=2)
            _ready[device] = False
    return _ready[device]


def _launch_target(t: Tensor) -> tuple[int, int]:
    """(device ordinal, current stream handle) for a launch on `t`'s device."""
    device = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return device, torch.cuda.current_stream(t.device).cuda_stream


def hash_uniform(seed: Tensor, offset: Tensor, n: int, salt: int) -> Tensor:
    """`rt.kernels` uniforms of one salt: seed, offset [N] int64 -> [N, n] float32, bit-identical."""
    seed = seed.to(torch.int64).contiguous()
    offset = offset.to(torch.int64).contiguous()
    rows = seed.shape[0]
    out = torch.empty(rows, n, dtype=torch.float32, device=seed.device)
    device, stream = _launch_target(seed)
    _rt.launch_hash_uniform(device, stream, seed.data_ptr(), offset.data_ptr(), out.data_ptr(), rows, n, salt)
    return out


def sample(logits: Tensor, allowed: Tensor | None, history: Tensor | None, repetition_penalty: Tensor,
           temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, seed: Tensor, offset: Tensor,
           salt: int) -> Tensor:
    """`rt.kernels.sample` in one kernel, repetition penalty included: logits [N, V] (V <= 8192),
    allowed [N, V] bool or None, history [N, W] int64 (-1 empty) or None, per-row parameters [N]
    -> [N] int64."""
    rows, vocab = logits.shape
    if vocab > MAX_SAMPLE_VOCAB:
        raise ValueError(f"the Rust sampler takes vocabularies up to {MAX_SAMPLE_VOCAB} ids, not {vocab}")
    # Kept referenced until the launch is queued; PyTorch's allocator orders their reuse on the stream.
    x = logits.float().contiguous()
    # A bool mask is read as bytes in place (no conversion kernel).
    mask = None if allowed is None else (allowed if allowed.dtype in (torch.bool, torch.uint8) else allowed != 0)
    mask = mask.contiguous() if mask is not None else None
    hist = history.to(torch.int64).contiguous() if history is not None and history.shape[1] else None
    params = [p.contiguous() for p in (temperature.float(), top_k.to(torch.int64), top_p.float(), min_p.float(),
                                       seed.to(torch.int64), offset.to(torch.int64), repetition_penalty.float())]
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    device, stream = _launch_target(logits)
    temp, k, p, mp, sd, off, pen = (t.data_ptr() for t in params)
    _rt.launch_sample(device=device, stream=stream, logits=x.data_ptr(), out=out.data_ptr(), rows=rows, vocab=vocab,
                      temperature=temp, top_k=k, top_p=p, min_p=mp, seed=sd, offset=off, salt=salt,
                      allowed=mask.data_ptr() if mask is not None else 0,
                      history=hist.data_ptr() if hist is not None else 0,
                      history_len=hist.shape[1] if hist is not None else 0, penalty=pen)
    return out

"""Zonos's sampling rules as capturable tensor functions (fixed shapes, no host syncs, per-row parameters).

The reference order, per codebook row: classifier-free guidance `uncond + (cond - uncond) * cfg_scale`,
padding columns -inf; at decode steps EOS is banned on heads 1-8; repetition penalty over the last
`window` input columns with factor `penalty ** count` (applied even when greedy); then greedy argmax, or
softmax(logits / temperature) -> unified sampler (linear > 0) -> top-p (> 0) -> top-k (> 0) -> min-p (> 0),
renormalising after each, and one draw. The draw is the exponential race `argmax(p / E)` as upstream, with
`E = -log U` from our counter-based uniforms (`kernels.hash_uniform`), so a draw depends on the request's
seed and step only; greedy and top-k 1 results equal the reference's exactly, sampled ones in distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vox_serve.models.zonos.config import EOS_ID, HEAD_ROWS, NUM_CODEBOOKS
from vox_serve.rt.kernels import hash_uniform

DEFAULT_SAMPLING = {"cfg_scale": 2.0, "temperature": 1.0, "top_p": 0.0, "top_k": 0, "min_p": 0.1, "linear": 0.0,
                    "conf": 0.0, "quad": 0.0, "repetition_penalty": 3.0, "repetition_window": 2,
                    "max_tokens": 86 * 30}


@dataclass
class ZonosSampling:
    """Per-request parameters, every field [N] on the logits' device (the reference's meanings: temperature
    0 = greedy, top_p / top_k / min_p / linear 0 = off, repetition_penalty 1 = off). offset: the request's
    step counter, advanced every step so each step draws fresh numbers."""

    temperature: Tensor
    top_p: Tensor
    top_k: Tensor
    min_p: Tensor
    linear: Tensor
    conf: Tensor
    quad: Tensor
    repetition_penalty: Tensor
    seed: Tensor
    offset: Tensor

    @classmethod
    def filled(cls, num_rows: int, *, device: torch.device | str = "cpu", seed: int = 0, offset: int = 0,
               **values: float) -> ZonosSampling:
        """Every row alike: the reference's defaults overridden by `values` (static buffers start here)."""
        unknown = set(values) - (set(cls.__dataclass_fields__) - {"seed", "offset"})
        if unknown:
            raise ValueError(f"unknown per-row sampling parameters {sorted(unknown)}")
        p = {**DEFAULT_SAMPLING, **values}

        def full(name: str, dtype: torch.dtype) -> Tensor:
            return torch.full((num_rows,), p[name], dtype=dtype, device=device)

        f32 = torch.float32
        return cls(temperature=full("temperature", f32), top_p=full("top_p", f32), top_k=full("top_k", torch.int64),
                   min_p=full("min_p", f32), linear=full("linear", f32), conf=full("conf", f32),
                   quad=full("quad", f32), repetition_penalty=full("repetition_penalty", f32),
                   seed=torch.full((num_rows,), seed, dtype=torch.int64, device=device),
                   offset=torch.full((num_rows,), offset, dtype=torch.int64, device=device))


def guided_logits(cond: Tensor, uncond: Tensor, cfg_scale: Tensor, width: int) -> Tensor:
    """cond, uncond [N, 9, 1025] float32, cfg_scale [N] -> [N, 9, width], columns >= 1025 at -inf.

    Padding comes after the mix (-inf in both rows would mix to NaN)."""
    mixed = uncond + (cond - uncond) * cfg_scale[:, None, None]
    pad = torch.full((*mixed.shape[:2], width - HEAD_ROWS), float("-inf"), device=mixed.device)
    return torch.cat([mixed, pad], dim=-1)


def ban_eos_after_head0(logits: Tensor) -> Tensor:
    """Decode steps: only codebook 0 may predict EOS. logits [N, 9, W] -> same, out of place."""
    return logits.masked_fill(entry_mask(logits.shape[1:], codebooks=slice(1, None), device=logits.device),
                              float("-inf"))


def entry_mask(shape: torch.Size, codebooks: slice, device: torch.device) -> Tensor:
    """[9, W] bool: True at EOS of the given codebooks. Built from comparisons, not item assignment: a
    `mask[k, EOS_ID] = True` copies a host scalar, which CUDA graph capture refuses."""
    rows = torch.arange(shape[0], device=device)
    picked = (rows >= (codebooks.start or 0)) & (rows < (shape[0] if codebooks.stop is None else codebooks.stop))
    return picked[:, None] & (torch.arange(shape[1], device=device) == EOS_ID)[None, :]


def repetition_penalty(logits: Tensor, history: Tensor, penalty: Tensor) -> Tensor:
    """The reference's windowed penalty: each occurrence of a token in a codebook's window multiplies the
    penalty in (`penalty ** count`); positive logits are divided by it, the others multiplied.

    logits [N, 9, W]; history [N, 9, window] int64 (the last input columns, -1 = empty, ids >= W clamp to
    W - 1 as upstream); penalty [N]. Returns [N, 9, W].
    """
    n, k, width = logits.shape
    index = torch.where(history >= 0, history.clamp(max=width - 1), width)  # empty slots -> a spare column
    rp = penalty.float()[:, None, None].expand(index.shape)
    factors = torch.ones(n, k, width + 1, device=logits.device).scatter_reduce(2, index, rp, reduce="prod")
    factors = factors[..., :width]
    return torch.where(logits <= 0, logits * factors, logits / factors)


def _renormalise(p: Tensor) -> Tensor:
    return p / p.sum(dim=-1, keepdim=True)


def _unified(probs: Tensor, linear: Tensor, conf: Tensor, quad: Tensor) -> Tensor:
    """NovelAI's unified sampler (the reference's `apply_unified`); rows with linear <= 0 pass through."""
    logp = torch.log(probs.clamp_min(1e-20))
    entropy = -(probs * logp).sum(dim=-1, keepdim=True)
    raw = logp * (linear[:, None] + entropy * conf[:, None]) - logp**2 * quad[:, None]
    return torch.where(linear[:, None] > 0, raw.softmax(dim=-1), probs)


def filtered_probs(logits: Tensor, params: ZonosSampling) -> Tensor:
    """The distribution a non-greedy row draws from: [N, 9, W] logits -> [N, 9, W] probabilities.

    Every filter keeps a prefix of the sorted order, so one sort serves all three (ties at the top-k
    pivot are all kept, as upstream); each renormalises as upstream does.
    """
    n, k, width = logits.shape

    def rows(x: Tensor) -> Tensor:  # [N] -> [N * 9]: the parameter of each codebook row
        return x.repeat_interleave(k)

    t = rows(torch.where(params.temperature > 0, params.temperature, 1.0))
    probs = torch.softmax(logits.reshape(n * k, width) / t[:, None], dim=-1)
    probs = _unified(probs, rows(params.linear), rows(params.conf), rows(params.quad))
    sorted_p, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    top_p = rows(params.top_p)[:, None]
    keep = (top_p <= 0) | (torch.cumsum(sorted_p, dim=-1) - sorted_p <= top_p)
    sorted_p = torch.where(top_p > 0, _renormalise(sorted_p * keep), sorted_p)
    top_k = rows(params.top_k)[:, None]
    pivot = sorted_p.gather(1, (top_k.clamp(1, width) - 1))
    sorted_p = torch.where(top_k > 0, _renormalise(torch.where(sorted_p < pivot, 0.0, sorted_p)), sorted_p)
    min_p = rows(params.min_p)[:, None]
    dropped = sorted_p < min_p * sorted_p[:, :1]
    sorted_p = torch.where(min_p > 0, _renormalise(sorted_p.masked_fill(dropped, 0.0)), sorted_p)
    return torch.zeros_like(sorted_p).scatter(1, ids, sorted_p).reshape(n, k, width)


def sample_codes(logits: Tensor, params: ZonosSampling) -> Tensor:
    """logits [N, 9, W] (guided, banned and penalised) -> tokens [N, 9] int64.

    Greedy rows take the argmax of the logits; the others draw from `filtered_probs`, codebook k of a
    row with the uniforms of stream `offset * 9 + k`.
    """
    n, k, width = logits.shape
    greedy = logits.argmax(dim=-1)
    probs = filtered_probs(logits, params)
    stream = params.offset[:, None] * NUM_CODEBOOKS + torch.arange(k, device=logits.device)
    uniform = hash_uniform(params.seed.repeat_interleave(k), stream.reshape(-1), width).reshape(n, k, width)
    drawn = (probs / -torch.log(uniform)).argmax(dim=-1)
    return torch.where(params.temperature[:, None] > 0, drawn, greedy)

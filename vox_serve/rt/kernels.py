"""Reference sampling kernels in plain PyTorch.

Everything here is CUDA-graph capturable: fixed shapes, no host synchronisation, no branching on
tensor values and no ``torch.Generator``. Randomness comes from a counter-based integer hash of
``(seed, offset, column)``, so a request's draws depend only on its own seed and step counter,
never on which batch or batch index it lands in. Faster kernels are tested against these.

On CUDA tensors the compiled kernels serve instead: the Rust extension's (`rt.rust_ops`) when it
is built, else Triton's (`rt.triton_ops`); both draw the same random bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from vox_serve.rt import rust_ops, triton_ops

_MASK32 = 0xFFFFFFFF
_GOLDEN32 = 0x9E3779B9
_SALT_UNIFORM = 0x243F6A88
_SALT_NORMAL_RADIUS = 0x85A308D3
_SALT_NORMAL_ANGLE = 0x13198A2E
_UNIFORM_BITS = 23  # float32 holds (k + 0.5) * 2**-23 exactly, so values stay strictly inside (0, 1)


def _mul32(a: Tensor, k: int) -> Tensor:
    """``a * k mod 2**32`` for ``0 <= a < 2**32`` without ever overflowing int64.

    Signed overflow would wrap on today's backends, but splitting ``k`` into 16-bit halves keeps
    every intermediate below 2**49, so compiled kernels (Triton, C++) cannot disagree with us.
    """
    low = a * (k & 0xFFFF)
    high = ((a * (k >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _fmix32(h: Tensor) -> Tensor:
    """MurmurHash3's 32-bit finaliser on non-negative int64 values below 2**32.

    Values stay non-negative, so torch's arithmetic right shift behaves like a logical one.
    """
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _hash_bits(seed: Tensor, offset: Tensor, n: int, salt: int) -> Tensor:
    """32 well-mixed bits per ``(seed, offset, column)``: ``[N], [N] -> [N, n]`` int64."""
    seed = seed.to(torch.int64)
    offset = offset.to(torch.int64)
    # Masking after the (arithmetic) shift gives the exact upper word even for negative values.
    words = (seed & _MASK32, (seed >> 32) & _MASK32, offset & _MASK32, (offset >> 32) & _MASK32)
    key = torch.full_like(seed, salt)
    for word in words:
        key = _fmix32(_mul32(key ^ word, _GOLDEN32) ^ 0x7F4A7C15)
    column = torch.arange(n, device=seed.device, dtype=torch.int64)
    # Two rounds over consecutive counters: one finaliser alone leaves visible structure.
    h = _fmix32((key[:, None] + _mul32(column, _GOLDEN32)[None, :]) & _MASK32)
    return _fmix32(h ^ key[:, None])


def _bits_to_uniform(bits: Tensor) -> Tensor:
    k = (bits >> (32 - _UNIFORM_BITS)).to(torch.float32)
    return (k + 0.5) * (2.0**-_UNIFORM_BITS)


def _uniform(seed: Tensor, offset: Tensor, n: int, salt: int) -> Tensor:
    """One salted stream of uniforms [N, n]; one fused kernel on a GPU, bit-identical to the ops here."""
    if rust_ops.enabled(seed):
        return rust_ops.hash_uniform(seed, offset, n, salt)
    if triton_ops.enabled(seed):
        return triton_ops.hash_uniform(seed, offset, n, salt)
    return _bits_to_uniform(_hash_bits(seed, offset, n, salt))


def hash_uniform(seed: Tensor, offset: Tensor, n: int) -> Tensor:
    """Counter-based uniforms in the open interval (0, 1).

    seed, offset: ``[N]`` int64 (any values, negatives included). Returns ``[N, n]`` float32 where
    entry ``[i, j]`` is a pure function of ``(seed[i], offset[i], j)``.
    """
    return _uniform(seed, offset, n, _SALT_UNIFORM)


def hash_normal(seed: Tensor, offset: Tensor, n: int) -> Tensor:
    """Counter-based standard normals ``[N, n]`` float32 (Box-Muller over two salted streams)."""
    radius = torch.sqrt(-2.0 * torch.log(_uniform(seed, offset, n, _SALT_NORMAL_RADIUS)))
    angle = (2.0 * math.pi) * _uniform(seed, offset, n, _SALT_NORMAL_ANGLE)
    return radius * torch.cos(angle)


@dataclass
class SamplingTensors:
    """Per-row sampling parameters, every field ``[N]`` on the logits' device.

    temperature: float32, 0 means greedy. top_k: int64, <= 0 disables. top_p: float32, 1.0
    disables. min_p: float32, 0 disables. repetition_penalty: float32, 1.0 disables.
    seed: int64. offset: int64, the step counter of the row's random stream (advance it every
    step so each step draws fresh numbers).
    """

    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    min_p: Tensor
    repetition_penalty: Tensor
    seed: Tensor
    offset: Tensor

    @classmethod
    def filled(
        cls,
        num_rows: int,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int = 0,
        offset: int = 0,
        device: torch.device | str = "cpu",
    ) -> SamplingTensors:
        """Every row with the same parameters (static buffers start from this, tests use it)."""

        def full(value: float | int, dtype: torch.dtype) -> Tensor:
            return torch.full((num_rows,), value, dtype=dtype, device=device)

        return cls(
            temperature=full(temperature, torch.float32),
            top_k=full(top_k, torch.int64),
            top_p=full(top_p, torch.float32),
            min_p=full(min_p, torch.float32),
            repetition_penalty=full(repetition_penalty, torch.float32),
            seed=full(seed, torch.int64),
            offset=full(offset, torch.int64),
        )


def greedy(logits: Tensor) -> Tensor:
    """``[N, V] -> [N]`` int64 argmax (first index among ties)."""
    return logits.argmax(dim=-1)


def apply_repetition_penalty(logits: Tensor, history: Tensor, penalty: Tensor) -> Tensor:
    """CTRL/HF repetition penalty, out of place.

    logits: ``[N, V]``; history: ``[N, W]`` int64 recent tokens, -1 for empty slots;
    penalty: ``[N]``. Each distinct token in a row's history has a positive logit divided by the
    penalty and a negative one multiplied by it. Returns ``[N, V]`` float32.
    """
    num_rows, vocab_size = logits.shape
    x = logits.float()
    # Empty slots scatter into a spare column V that is cut off afterwards, so they touch nothing
    # without a data-dependent shape.
    index = torch.where(history >= 0, history, torch.full_like(history, vocab_size))
    present = torch.zeros(num_rows, vocab_size + 1, dtype=torch.bool, device=logits.device)
    present = present.scatter(1, index, True)[:, :vocab_size]
    factor = penalty.float()[:, None]
    penalised = torch.where(x > 0, x / factor, x * factor)
    return torch.where(present, penalised, x)


def masked_logits(logits: Tensor, params: SamplingTensors, history: Tensor | None = None,
                  allowed: Tensor | None = None) -> Tensor:
    """float32 logits [N, V] with the disallowed tokens at -inf and the repetition penalty applied: what the
    temperature and the top-k / top-p / min-p filters then work on."""
    x = logits.float()
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    if history is not None:
        x = apply_repetition_penalty(x, history, params.repetition_penalty)
    return x


def probs_after_filters(
    logits: Tensor,
    params: SamplingTensors,
    history: Tensor | None = None,
    allowed: Tensor | None = None,
) -> Tensor:
    """The renormalised distribution ``[N, V]`` float32 that :func:`sample` draws from.

    Order: disallowed tokens (``allowed`` ``[N, V]`` bool, False = banned) get -inf, repetition
    penalty over ``history`` ``[N, W]``, temperature, softmax, then top-k, top-p and min-p over the
    descending order. Top-p is measured on the distribution left by top-k (as in HF and vLLM):
    the smallest prefix whose mass reaches top_p is kept. The most likely token is always kept.
    Greedy rows (temperature 0) come out one-hot at the argmax. Every row needs an allowed token.
    """
    x = masked_logits(logits, params, history, allowed)
    vocab_size = x.shape[-1]
    is_greedy = (params.temperature <= 0)[:, None]
    temperature = torch.where(is_greedy[:, 0], 1.0, params.temperature.float())
    # Sorting logits rather than probabilities keeps greedy exact where softmax would round to ties;
    # a stable sort makes ties resolve to the lowest token id, like argmax.
    sorted_logits, sorted_ids = torch.sort(x / temperature[:, None], dim=-1, descending=True, stable=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    rank = torch.arange(vocab_size, device=x.device)[None, :]

    top_k = params.top_k[:, None]
    keep = (top_k <= 0) | (rank < top_k)
    mass_k = (sorted_probs * keep).sum(dim=-1, keepdim=True)
    # Mass strictly before each position, compared against top_p scaled to the top-k mass, i.e.
    # top-p on the renormalised top-k distribution without a second softmax.
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    top_p = params.top_p.float()[:, None]
    keep &= (top_p >= 1.0) | (mass_before < top_p * mass_k)
    keep &= sorted_probs >= params.min_p.float()[:, None] * sorted_probs[:, :1]
    keep |= rank == 0
    keep &= ~is_greedy | (rank == 0)

    kept = sorted_probs * keep
    kept = kept / kept.sum(dim=-1, keepdim=True)
    return torch.zeros_like(kept).scatter(1, sorted_ids, kept)


def sample(
    logits: Tensor,
    params: SamplingTensors,
    history: Tensor | None = None,
    allowed: Tensor | None = None,
) -> Tensor:
    """Draw one token per row: ``logits [N, V]`` (any float dtype) -> ``[N]`` int64.

    Filters as in :func:`probs_after_filters`; the draw is the Gumbel-max trick in its
    exponential-race form, ``argmax(p / E)`` with ``E = -log(U)``, which equals
    ``argmax(log p + Gumbel)`` but needs no log of zero probabilities. ``U`` is
    ``hash_uniform(seed, offset, V)``, so a row's token depends only on its logits, filters,
    seed and offset: never on the other rows or its batch index.

    Multi-codebook models flatten ``[B, C, V]`` logits to ``[B * C, V]`` and give every codebook
    row its own seed or offset (e.g. ``offset = step * C + codebook``) so codebooks draw
    independent numbers.
    """
    if rust_ops.enabled(logits) and logits.shape[-1] <= rust_ops.MAX_SAMPLE_VOCAB:
        # One kernel for the penalty, the filters and the draw.
        return rust_ops.sample(logits, allowed, history, params.repetition_penalty, params.temperature, params.top_k,
                               params.top_p, params.min_p, params.seed, params.offset, _SALT_UNIFORM)
    if triton_ops.enabled(logits) and logits.shape[-1] <= triton_ops.MAX_SAMPLE_VOCAB:
        # One fused kernel for the filters and the draw (~40 small kernels here).
        x = logits if history is None else apply_repetition_penalty(logits, history, params.repetition_penalty)
        return triton_ops.sample(x, allowed, params.temperature, params.top_k, params.top_p, params.min_p,
                                 params.seed, params.offset, _SALT_UNIFORM)
    if not logits.is_cuda and bool((params.temperature <= 0).all()):
        # On the CPU reading the parameters costs no synchronisation: a batch of greedy rows needs neither the
        # sort nor the random stream (the same tokens: the filters leave a greedy row one-hot at its argmax).
        return greedy(masked_logits(logits, params, history, allowed))
    return sample_unfused(logits, params, history, allowed)


def sample_unfused(
    logits: Tensor,
    params: SamplingTensors,
    history: Tensor | None = None,
    allowed: Tensor | None = None,
) -> Tensor:
    """:func:`sample` in PyTorch operations (the reference the fused kernels are checked against)."""
    probs = probs_after_filters(logits, params, history, allowed)
    uniform = hash_uniform(params.seed, params.offset, probs.shape[-1])
    # Filtered tokens have p = 0 and E is finite and positive, so they can never win.
    return (probs / -torch.log(uniform)).argmax(dim=-1)

"""Tensors derived from a module's parameters (a log-scale's exp, a reciprocal), computed once instead of in
every forward: in a captured codec graph each such op is a kernel of its own per launch (the Qwen3-TTS
codec's SnakeBeta layers alone made ~90 per launch). Computed again only when a parameter changes: a new
tensor or storage (a checkpoint load, `.to(device)`, a dtype cast) or an in-place write (its version)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def _key(params: tuple[Tensor, ...]) -> tuple:
    return tuple((id(p), p.data_ptr(), p.device, p.dtype, p._version) for p in params)


class Derived:
    """`get(*params)`: `compute(*params)` as of the parameters' current values."""

    def __init__(self, compute: Callable[..., tuple[Tensor, ...]]) -> None:
        self.compute = compute
        self._key: tuple | None = None
        self._value: tuple[Tensor, ...] = ()

    def get(self, *params: Tensor) -> tuple[Tensor, ...]:
        key = _key(params)
        if key != self._key:
            # plain tensors without autograd history, whatever mode the first forward ran in
            with torch.inference_mode(False), torch.no_grad():
                self._value = tuple(self.compute(*params))
            self._key = key
        return self._value

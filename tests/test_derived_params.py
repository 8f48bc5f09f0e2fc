"""Tensors derived from parameters (`vox_serve.rt.derived`): computed once, computed again after a
checkpoint load, an in-place write or a move, and equal to computing them in every forward."""

from __future__ import annotations

import torch

from vox_serve.codecs.qwen3.layers import SnakeBeta
from vox_serve.rt.derived import Derived


def test_computed_once_until_a_parameter_changes() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    calls = []
    derived = Derived(lambda a: (calls.append(1) or a * 2,))
    first = derived.get(p)
    assert derived.get(p) is first and len(calls) == 1
    with torch.no_grad():
        p.copy_(torch.full((3,), 5.0))  # what load_state_dict does
    assert torch.equal(derived.get(p)[0], torch.full((3,), 10.0)) and len(calls) == 2
    q = torch.nn.Parameter(torch.ones(3))  # another parameter, same values
    derived.get(q)
    assert len(calls) == 3
    (moved,) = derived.get(p.double())
    assert moved.dtype == torch.float64 and len(calls) == 4


def test_values_carry_no_autograd_history_whatever_the_mode() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    with torch.inference_mode():
        (value,) = Derived(lambda a: (a.exp(),)).get(p)
    assert not value.requires_grad and not value.is_inference()
    (value * p).sum().backward()  # usable in a later forward with autograd


def test_snake_beta_after_a_checkpoint_load_uses_the_loaded_parameters() -> None:
    snake = SnakeBeta(4)
    x = torch.randn(2, 4, 5)
    snake(x)  # factors of the initial parameters, cached
    alpha, beta = torch.randn(4), torch.randn(4)
    snake.load_state_dict({"alpha": alpha, "beta": beta})
    a, inv_b = alpha.exp()[None, :, None], 1.0 / (beta.exp()[None, :, None] + 1e-9)
    torch.testing.assert_close(snake(x), x + inv_b * torch.sin(x * a).pow(2), rtol=0, atol=0)

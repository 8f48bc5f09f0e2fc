"""Zonos sampling rules against upstream's functions (fixture), plus the properties of our draw."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from zonos_helpers import FIXTURES

from vox_serve.models.zonos import delay, sampling

FILTERS = json.loads((FIXTURES / "scenarios.json").read_text())["filters"]
PROBS_ATOL = 1e-6


@pytest.fixture(scope="module")
def fx() -> dict[str, torch.Tensor]:
    return load_file(FIXTURES / "expected_sampling.safetensors")


@pytest.mark.parametrize("window", [2, 3])
def test_repetition_penalty_matches_reference(fx, window: int) -> None:
    """penalty ** count over the window, mask ids clamped to the last column, applied by sign."""
    history = fx["history"][..., -window:]
    got = sampling.repetition_penalty(fx["logits"], history, torch.tensor([3.0]))
    assert torch.equal(got, fx[f"penalised_w{window}"])


def test_repetition_penalty_ignores_empty_slots(fx) -> None:
    history = torch.full((1, 3, 4), -1)
    assert torch.equal(sampling.repetition_penalty(fx["logits"], history, torch.tensor([3.0])), fx["logits"])


@pytest.mark.parametrize("index", range(len(FILTERS)))
def test_filters_match_reference(fx, index: int) -> None:
    """softmax(l / T) -> unified -> top-p -> top-k -> min-p, as upstream's apply_* chain."""
    params = sampling.ZonosSampling.filled(1, **{"min_p": 0.0, **FILTERS[index]})
    got = sampling.filtered_probs(fx["logits"], params)
    want = fx[f"probs_{index}"]
    assert torch.equal(got > 0, want > 0)
    assert (got - want).abs().max() < PROBS_ATOL


def test_delay_pattern_matches_reference(fx) -> None:
    assert torch.equal(delay.delay(fx["pattern_codes"]), fx["pattern_delayed"])
    assert torch.equal(delay.undelay(fx["pattern_delayed"]), fx["pattern_reverted"])


def test_draw_depends_on_seed_and_step_only(fx) -> None:
    """A row's tokens are the same alone or in a batch; another seed or step gives other tokens; a draw
    never picks a filtered-out token."""
    logits = fx["logits"].expand(2, 3, -1).clone()
    params = sampling.ZonosSampling.filled(2, min_p=0.0, temperature=1.5, seed=9, offset=4)
    params.seed[1] = 10
    both = sampling.sample_codes(logits, params)
    alone = sampling.sample_codes(logits[:1], sampling.ZonosSampling.filled(1, min_p=0.0, temperature=1.5, seed=9,
                                                                              offset=4))
    assert torch.equal(both[:1], alone) and not torch.equal(both[0], both[1])
    later = sampling.ZonosSampling.filled(1, min_p=0.0, temperature=1.5, seed=9, offset=5)
    assert not torch.equal(sampling.sample_codes(logits[:1], later), alone)
    narrow = sampling.ZonosSampling.filled(1, min_p=0.5, seed=9)
    probs = sampling.filtered_probs(logits[:1], narrow)
    drawn = sampling.sample_codes(logits[:1], narrow)
    assert bool((probs.gather(2, drawn[..., None]) > 0).all())


def test_draw_follows_the_distribution() -> None:
    """Frequencies over many seeds match the filtered probabilities (4 sigma)."""
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5]).log_softmax(0)
    logits = torch.cat([logits, torch.full((4,), -30.0)]).expand(4096, 9, -1).contiguous()  # any width works
    params = sampling.ZonosSampling.filled(4096, min_p=0.0)
    params.seed.copy_(torch.arange(4096))
    tokens = sampling.sample_codes(logits, params)[:, 0]
    want = sampling.filtered_probs(logits[:1], sampling.ZonosSampling.filled(1, min_p=0.0))[0, 0, :4]
    freq = torch.bincount(tokens, minlength=4)[:4].float() / 4096
    assert ((freq - want).abs() < 4 * (want * (1 - want) / 4096).sqrt()).all()


def test_greedy_rows_take_the_argmax(fx) -> None:
    params = sampling.ZonosSampling.filled(1, temperature=0.0)
    assert torch.equal(sampling.sample_codes(fx["logits"], params), fx["logits"].argmax(-1))


def test_guidance_pads_after_mixing() -> None:
    cond, uncond = torch.randn(2, 9, 1025), torch.randn(2, 9, 1025)
    out = sampling.guided_logits(cond, uncond, torch.tensor([2.0, 3.0]), 1026)
    assert out.shape == (2, 9, 1026) and bool(torch.isneginf(out[..., 1025]).all())
    assert torch.allclose(out[1, :, :1025], uncond[1] + 3.0 * (cond[1] - uncond[1]))
    banned = sampling.ban_eos_after_head0(out)
    assert bool(torch.isneginf(banned[:, 1:, 1024]).all()) and torch.equal(banned[:, 0], out[:, 0])


def test_stop_rule_diagonal() -> None:
    """EOS in codebook 0 at step s forces EOS into codebook j at step s + j, mask below it."""
    remaining, stopping = torch.tensor([20]), torch.tensor([False])
    tokens = torch.arange(9)[None].clone()
    tokens[0, 0] = 1024
    rows = []
    for _ in range(9):
        out, remaining, stopping = delay.stop_rule(tokens, remaining, stopping)
        rows.append(out[0].tolist())
        tokens = torch.arange(9)[None]
    assert int(remaining) == 0 and bool(stopping)
    for j, row in enumerate(rows):
        assert row[:j] == [1025] * j and row[j] == 1024 and row[j + 1 :] == list(range(j + 1, 9))


def test_write_column_takes_tokens_in_order() -> None:
    """Past the last frame (A = 3 frames, column 5) codebooks 0-1 are known: 2.. take tokens 0.."""
    unknown = delay.unknown_entries(torch.tensor([5]), torch.tensor([0]), torch.tensor([3]))
    assert unknown[0].tolist() == [False, False, True, True, True, False, False, False, False]
    col = delay.write_column(torch.arange(100, 109)[None], torch.full((1, 9), 1025), unknown)
    assert col[0].tolist() == [1025, 1025, 100, 101, 102, 1025, 1025, 1025, 1025]

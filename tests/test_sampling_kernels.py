"""The reference sampling kernels: filters, penalties, counter-based randomness, graph capture."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vox_serve.rt.kernels import (
    SamplingTensors,
    _bits_to_uniform,
    apply_repetition_penalty,
    greedy,
    hash_normal,
    hash_uniform,
    probs_after_filters,
    sample,
    sample_unfused,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
CHI2_DOF7_P001 = 24.32  # chi-square critical value, 7 degrees of freedom, p = 0.001


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_logits(num_rows: int, vocab_size: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(num_rows, vocab_size, generator=_gen(seed)) * scale


def _random_streams(params: SamplingTensors, seed: int) -> SamplingTensors:
    g = _gen(seed)
    n = params.seed.shape[0]
    params.seed = torch.randint(INT64_MIN, INT64_MAX, (n,), generator=g)
    params.offset = torch.randint(0, 2**40, (n,), generator=g)
    return params


def _samples_over_offsets(logits, params, num_offsets, **kwargs) -> torch.Tensor:
    """``[num_offsets, N]`` tokens, one draw per step of every row's stream."""
    base = params.offset.clone()
    draws = []
    for step in range(num_offsets):
        params.offset = base + step
        draws.append(sample(logits, params, **kwargs))
    params.offset = base
    return torch.stack(draws)


def _chi_square(tokens: torch.Tensor, expected_probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=expected_probs.numel()).double()
    expected = expected_probs.double() * tokens.numel()
    assert torch.all(counts[expected == 0] == 0), "drew a token with zero probability"
    nonzero = expected > 0
    return float((((counts - expected) ** 2)[nonzero] / expected[nonzero]).sum())


def _mixed_batch(num_rows: int, vocab_size: int, seed: int):
    """Random logits, every filter mixed per row, random history and allowed masks."""
    g = _gen(seed)
    logits = _random_logits(num_rows, vocab_size, seed + 1)
    params = SamplingTensors(
        temperature=torch.where(
            torch.rand(num_rows, generator=g) < 0.25, 0.0, torch.rand(num_rows, generator=g) + 0.3
        ),
        top_k=torch.randint(-1, 8, (num_rows,), generator=g),
        top_p=torch.where(torch.rand(num_rows, generator=g) < 0.3, 1.0, torch.rand(num_rows, generator=g)),
        min_p=torch.rand(num_rows, generator=g) * 0.3,
        repetition_penalty=1.0 + torch.rand(num_rows, generator=g),
        seed=torch.zeros(num_rows, dtype=torch.int64),
        offset=torch.zeros(num_rows, dtype=torch.int64),
    )
    _random_streams(params, seed + 2)
    history = torch.randint(-1, vocab_size, (num_rows, 6), generator=g)
    allowed = torch.rand(num_rows, vocab_size, generator=g) < 0.8
    allowed[:, 0] = True
    return logits, params, history, allowed


# --- counter-based random numbers ---------------------------------------------------------------


def test_hash_uniform_is_strictly_inside_unit_interval_and_uniform():
    seeds = torch.tensor([0, 1, -1, 7, INT64_MIN, INT64_MAX, 123456789, -987654321])
    offsets = torch.tensor([0, 0, 5, 2**33, -1, 3, INT64_MAX, INT64_MIN])
    u = hash_uniform(seeds, offsets, 50_000)
    assert u.shape == (8, 50_000) and u.dtype == torch.float32
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert abs(float(u.mean()) - 0.5) < 0.005
    assert abs(float(u.var()) - 1 / 12) < 0.002
    counts = torch.histc(u, bins=64, min=0.0, max=1.0)
    chi2 = float(((counts - u.numel() / 64) ** 2).sum() / (u.numel() / 64))
    assert chi2 < 103.4  # 63 degrees of freedom, p = 0.001


def test_hash_uniform_uses_all_its_bits_and_never_reaches_the_endpoints():
    u = hash_uniform(torch.arange(8), torch.zeros(8, dtype=torch.int64), 50_000)
    assert u.unique().numel() > 390_000  # 2**23 levels: ~9.5k collisions expected among 400k draws
    extremes = _bits_to_uniform(torch.tensor([0, 2**32 - 1]))  # the smallest and largest hash values
    assert 0 < float(extremes[0]) < 1e-6 and 1 - 1e-6 < float(extremes[1]) < 1


def test_hash_uniform_streams_are_decorrelated_across_offsets_seeds_and_columns():
    seeds = torch.full((2000,), 42)
    u = hash_uniform(seeds, torch.arange(2000), 64)
    v = hash_uniform(seeds + 1, torch.arange(2000), 64)

    def corr(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])

    assert abs(corr(u[:-1], u[1:])) < 0.02  # successive offsets
    assert abs(corr(u[:, :-1], u[:, 1:])) < 0.02  # neighbouring columns
    assert abs(corr(u, v)) < 0.02  # neighbouring seeds


def test_hash_uniform_depends_only_on_seed_offset_and_column():
    seeds = torch.tensor([3, -8, 99, 3])
    offsets = torch.tensor([10, 2, 0, 11])
    batch = hash_uniform(seeds, offsets, 300)
    for i in range(4):
        alone = hash_uniform(seeds[i : i + 1], offsets[i : i + 1], 300)
        assert torch.equal(alone[0], batch[i])
    assert torch.equal(hash_uniform(seeds, offsets, 100), batch[:, :100])  # n only truncates
    assert not torch.equal(batch[0], batch[3])  # next step of the same stream is fresh


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(INT64_MIN, INT64_MAX),
    offset=st.integers(INT64_MIN, INT64_MAX),
)
def test_hash_uniform_stays_open_interval_for_any_int64(seed, offset):
    u = hash_uniform(torch.tensor([seed]), torch.tensor([offset]), 2000)
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert torch.equal(u, hash_uniform(torch.tensor([seed]), torch.tensor([offset]), 2000))


def test_hash_normal_is_standard_normal():
    z = hash_normal(torch.arange(8) * 1000 - 5, torch.arange(8), 20_000)
    assert z.shape == (8, 20_000) and bool(torch.isfinite(z).all())
    assert abs(float(z.mean())) < 0.01
    assert abs(float(z.std()) - 1.0) < 0.01
    assert abs(float((z.abs() < 1).float().mean()) - 0.6827) < 0.005


# --- filters --------------------------------------------------------------------------------------


def test_top_k_never_returns_a_token_outside_the_rows_top_k():
    num_rows, vocab_size = 256, 40
    logits = _random_logits(num_rows, vocab_size, 0)
    params = _random_streams(SamplingTensors.filled(num_rows, temperature=1.5), 1)
    params.top_k = torch.randint(1, 8, (num_rows,), generator=_gen(2))
    draws = _samples_over_offsets(logits, params, 40)
    ranks = (logits[None, :, :] > logits.gather(1, draws.T).T[:, :, None]).sum(-1)
    assert bool((ranks < params.top_k[None, :]).all())
    assert bool((ranks == params.top_k[None, :] - 1).any())  # the k-th token is reachable


def test_top_k_breaks_ties_towards_the_lowest_token_id():
    num_rows, vocab_size = 64, 48
    g = _gen(20)
    logits = torch.randint(0, 3, (num_rows, vocab_size), generator=g).float()  # many ties
    params = _random_streams(SamplingTensors.filled(num_rows), 21)
    params.top_k = torch.randint(1, 20, (num_rows,), generator=g)
    ids = torch.arange(vocab_size)
    higher = logits[:, None, :] > logits[:, :, None]
    tied_before = (logits[:, None, :] == logits[:, :, None]) & (ids[None, :] < ids[:, None])[None]
    rank = (higher | tied_before).sum(-1)  # [row, token]: position in a descending, id-stable order
    support = probs_after_filters(logits, params) > 0
    assert torch.equal(support, rank < params.top_k[:, None])


def test_top_p_keeps_the_smallest_prefix_reaching_top_p():
    num_rows, vocab_size = 256, 30
    logits = _random_logits(num_rows, vocab_size, 3)
    params = _random_streams(SamplingTensors.filled(num_rows), 4)
    params.top_p = 0.05 + 0.9 * torch.rand(num_rows, generator=_gen(5))
    probs = torch.softmax(logits.double(), dim=-1)
    kept = probs_after_filters(logits, params)
    support = kept > 0

    mass = (probs * support).sum(-1)
    smallest = torch.where(support, probs, torch.inf).min(-1).values
    largest_dropped = torch.where(support, -torch.inf, probs).max(-1).values
    top_p = params.top_p.double()
    assert bool((mass >= top_p - 1e-6).all())
    assert bool((mass - smallest < top_p + 1e-6).all())
    assert bool((smallest >= largest_dropped).all())
    assert torch.allclose(kept.double(), probs * support / mass[:, None], atol=1e-6)

    draws = _samples_over_offsets(logits, params, 32)
    assert bool(support.gather(1, draws.T).all())


def test_top_p_of_one_and_tiny_top_p_keep_everything_and_only_the_best():
    logits = _random_logits(8, 1000, 6, scale=0.1)
    params = SamplingTensors.filled(8, top_p=1.0)
    assert bool((probs_after_filters(logits, params) > 0).all())
    params.top_p.fill_(1e-9)
    kept = probs_after_filters(logits, params)
    assert torch.equal((kept > 0).sum(-1), torch.ones(8, dtype=torch.int64))
    assert torch.equal(kept.argmax(-1), logits.argmax(-1))


def test_min_p_samples_have_prob_at_least_min_p_times_max():
    num_rows, vocab_size = 256, 50
    logits = _random_logits(num_rows, vocab_size, 7)
    params = _random_streams(SamplingTensors.filled(num_rows), 8)
    params.min_p = 0.05 + 0.45 * torch.rand(num_rows, generator=_gen(9))
    probs = torch.softmax(logits, dim=-1)
    threshold = params.min_p * probs.max(-1).values
    support = probs_after_filters(logits, params) > 0
    assert torch.equal(support, probs >= threshold[:, None])
    draws = _samples_over_offsets(logits, params, 32)
    assert bool((probs.gather(1, draws.T).T >= threshold[None, :] - 1e-7).all())


# --- repetition penalty ----------------------------------------------------------------------------


def test_repetition_penalty_shrinks_positive_grows_negative_and_ignores_empty_slots():
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 4.0, 0.0], [2.0, -1.0, 0.5, -3.0, 4.0, 0.0]])
    history = torch.tensor([[0, 1, 1, -1, -1, 5], [-1, -1, -1, -1, -1, -1]])
    penalty = torch.tensor([2.0, 3.0])
    out = apply_repetition_penalty(logits, history, penalty)
    assert torch.equal(out[0], torch.tensor([1.0, -2.0, 0.5, -3.0, 4.0, 0.0]))  # 1 penalised once
    assert torch.equal(out[1], logits[1])  # an all-empty history changes nothing
    assert torch.equal(logits[0], torch.tensor([2.0, -1.0, 0.5, -3.0, 4.0, 0.0]))  # out of place


def test_repetition_penalty_on_random_rows_matches_the_rule():
    g = _gen(10)
    logits = _random_logits(64, 100, 11).to(torch.bfloat16)
    history = torch.randint(-1, 100, (64, 20), generator=g)
    penalty = 1.0 + 2.0 * torch.rand(64, generator=g)
    out = apply_repetition_penalty(logits, history, penalty)
    x = logits.float()
    assert out.dtype == torch.float32
    present = torch.zeros(64, 100, dtype=torch.bool)
    for row, tokens in enumerate(history.tolist()):
        present[row, [t for t in tokens if t >= 0]] = True
    assert torch.equal(out[~present], x[~present])
    assert bool((out[present & (x > 0)] < x[present & (x > 0)]).all())
    assert bool((out[present & (x < 0)] < x[present & (x < 0)]).all())


def test_greedy_with_strong_penalty_avoids_the_repeated_token():
    logits = torch.tensor([[1.0, 5.0, 4.0, 0.5], [-4.0, -1.0, -2.0, -3.0]])
    history = torch.tensor([[1, -1], [1, 1]])
    params = SamplingTensors.filled(2, temperature=0.0, repetition_penalty=10.0)
    assert torch.equal(sample(logits, params), torch.tensor([1, 1]))
    assert torch.equal(sample(logits, params, history=history), torch.tensor([2, 2]))


# --- row independence and repeatability -------------------------------------------------------------


def test_a_rows_sample_does_not_depend_on_its_batch_or_index():
    logits, params, history, allowed = _mixed_batch(32, 64, 12)
    batch = sample(logits, params, history, allowed)
    perm = torch.randperm(32, generator=_gen(13))
    other_logits, other_params, other_history, other_allowed = _mixed_batch(32, 64, 14)

    def rows(i: int, j: int) -> SamplingTensors:  # row i of the batch next to row j of the other
        fields = {k: torch.stack([getattr(params, k)[i], getattr(other_params, k)[j]]) for k in vars(params)}
        return SamplingTensors(**fields)

    for i in range(32):
        alone = SamplingTensors(**{k: v[i : i + 1] for k, v in vars(params).items()})
        assert sample(logits[i : i + 1], alone, history[i : i + 1], allowed[i : i + 1])[0] == batch[i]
        mixed = sample(
            torch.stack([logits[i], other_logits[i]]),
            rows(i, i),
            torch.stack([history[i], other_history[i]]),
            torch.stack([allowed[i], other_allowed[i]]),
        )
        assert mixed[0] == batch[i]
    permuted = SamplingTensors(**{k: v[perm] for k, v in vars(params).items()})
    assert torch.equal(sample(logits[perm], permuted, history[perm], allowed[perm]), batch[perm])


def test_same_seed_and_offset_repeat_and_other_streams_draw_fresh_tokens():
    vocab_size, num_rows = 2048, 128
    logits = torch.zeros(num_rows, vocab_size)  # uniform: every distinct draw shows up
    params = SamplingTensors.filled(num_rows, seed=77)
    params.offset = torch.arange(num_rows)
    over_offsets = sample(logits, params)
    assert torch.equal(over_offsets, sample(logits, params))
    assert over_offsets.unique().numel() > 115  # ~124 expected for 128 draws from 2048

    params.offset = torch.zeros(num_rows, dtype=torch.int64)
    params.seed = torch.arange(num_rows) * 7919
    over_seeds = sample(logits, params)
    assert over_seeds.unique().numel() > 115
    assert (over_seeds != over_offsets).float().mean() > 0.9


def test_sample_frequencies_match_softmax_at_temperature_one():
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -1.5, 0.7, 1.2])
    num_draws = 20_000
    params = SamplingTensors.filled(num_draws, seed=2024)
    params.offset = torch.arange(num_draws)
    tokens = sample(logits.expand(num_draws, -1), params)
    assert _chi_square(tokens, torch.softmax(logits, -1)) < CHI2_DOF7_P001


def test_sample_frequencies_match_filtered_tempered_distribution():
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -1.5, 0.7, 1.2])
    num_draws = 20_000
    params = SamplingTensors.filled(num_draws, temperature=0.7, top_k=5, seed=-31)
    params.offset = torch.arange(num_draws) * 3 + 11
    tokens = sample(logits.expand(num_draws, -1), params)
    expected = torch.softmax(logits / 0.7, -1)
    expected[expected < expected.topk(5).values[-1]] = 0
    assert _chi_square(tokens, expected / expected.sum()) < CHI2_DOF7_P001


# --- greedy and allowed masks ----------------------------------------------------------------------


def test_greedy_rows_take_the_argmax_whatever_the_other_params():
    logits, params, _, _ = _mixed_batch(128, 64, 15)
    params.temperature.zero_()
    assert torch.equal(sample(logits, params), greedy(logits))
    assert torch.equal(sample(logits, params), logits.argmax(-1))
    assert torch.equal(sample_unfused(logits, params), greedy(logits))  # the reference path, not the shortcut
    onehot = probs_after_filters(logits, params)
    assert torch.equal(onehot, torch.nn.functional.one_hot(logits.argmax(-1), 64).float())


def test_an_all_greedy_cpu_batch_skips_the_draw_and_gives_the_unfused_tokens(monkeypatch: pytest.MonkeyPatch):
    """sample()'s CPU shortcut for a batch of greedy rows: the unfused path's tokens, ties to the lowest id, under
    allowed masks and the repetition penalty, without drawing random numbers."""
    logits, params, history, _ = _mixed_batch(128, 64, 17)
    logits = logits.round()  # many ties
    allowed = torch.rand(logits.shape, generator=_gen(18)) > 0.3
    allowed[:, 5] = True
    params.temperature.zero_()
    expected = sample_unfused(logits, params, history, allowed)
    monkeypatch.setattr("vox_serve.rt.kernels.hash_uniform", lambda *a: pytest.fail("drew random numbers"))
    assert torch.equal(sample(logits, params, history, allowed), expected)


def test_allowed_mask_is_respected_by_greedy_and_sampled_rows():
    logits, params, history, _ = _mixed_batch(128, 64, 16)
    allowed = torch.ones_like(logits, dtype=torch.bool)
    allowed[torch.arange(128), logits.argmax(-1)] = False  # ban every row's favourite
    allowed &= torch.rand(logits.shape, generator=_gen(17)) < 0.5
    allowed[:, 0] = True
    is_greedy = params.temperature == 0
    draws = _samples_over_offsets(logits, params, 16, history=history, allowed=allowed)
    assert bool(allowed.gather(1, draws.T).all())
    banned = logits.masked_fill(~allowed, float("-inf"))
    masked = apply_repetition_penalty(banned, history, params.repetition_penalty)
    assert torch.equal(draws[0][is_greedy], masked.argmax(-1)[is_greedy])


def test_half_precision_logits_sample_like_their_float32_values():
    logits, params, history, allowed = _mixed_batch(64, 64, 18)
    for dtype in (torch.bfloat16, torch.float16):
        low = logits.to(dtype)
        expected = sample(low.float(), params, history, allowed)
        assert torch.equal(sample(low, params, history, allowed), expected)


# --- CUDA graphs -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sample_captured_in_a_cuda_graph_equals_eager():
    cpu_logits, cpu_params, cpu_history, cpu_allowed = _mixed_batch(64, 512, 19)
    logits, history, allowed = cpu_logits.cuda(), cpu_history.cuda(), cpu_allowed.cuda()
    params = SamplingTensors(**{k: v.cuda() for k, v in vars(cpu_params).items()})

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the default stream, as capture requires
        for _ in range(2):
            sample(logits, params, history, allowed)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sample(logits, params, history, allowed)

    for step in range(5):
        params.offset.add_(1)  # static buffers updated in place, as the runtime does every step
        logits.copy_(_random_logits(64, 512, 100 + step).cuda())
        graph.replay()
        eager = sample(logits, params, history, allowed)
        assert torch.equal(captured, eager)
    cpu_params.offset = params.offset.cpu()
    assert torch.equal(captured.cpu(), sample(logits.cpu(), cpu_params, cpu_history, cpu_allowed))

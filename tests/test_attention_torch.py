"""TorchAttentionBackend against a dense float64 reference over contiguous per-sequence K/V."""

from dataclasses import dataclass, fields

import numpy as np
import pytest
import torch

from vox_serve.rt.attention import (
    AttentionBuffers,
    AttentionPlan,
    PlanInputs,
    TorchAttentionBackend,
    make_attention_backend,
    paged_kv_offsets,
)
from vox_serve.rt.lm_batch import _kv_indices

PAGE_SIZE = 4
HEAD_DIM = 16
NUM_PAGES = 64
LAYER = 1  # the layer under test; layer 0 must stay untouched
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])]


def make_backend(hq: int = 8, hkv: int = 2, device: str = "cpu") -> TorchAttentionBackend:
    backend = make_attention_backend(
        "torch",
        num_layers=2,
        num_pages=NUM_PAGES,
        page_size=PAGE_SIZE,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=HEAD_DIM,
        dtype=torch.float32,
        device=device,
    )
    assert isinstance(backend, TorchAttentionBackend)
    return backend


@dataclass
class Step:
    plan: AttentionPlan
    bufs: AttentionBuffers
    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    full_k: list[torch.Tensor]  # per sequence [kv_len, Hkv, D]: prior context then the new tokens
    full_v: list[torch.Tensor]


def make_step(backend, specs, num_rows: int, max_batch: int = 8, max_pages: int = 8, seed: int = 0) -> Step:
    """specs: (prior_len, qo_len) per sequence. Rows past the real tokens are padding (slot 0).

    Fills every cache with noise (so unmasked garbage would show), hands out shuffled page ids
    (never the null page 0) and writes each sequence's prior context into the layer under test.
    """
    gen = torch.Generator().manual_seed(seed)
    dev, hq, hkv = backend.device, backend.num_q_heads, backend.num_kv_heads
    for cache in backend.kv_caches:
        cache.copy_(torch.randn(cache.shape, generator=gen))
    free_pages = (torch.randperm(NUM_PAGES - 1, generator=gen) + 1).tolist()
    page_table = torch.zeros(max_batch, max_pages, dtype=torch.int32)
    kv_lens = torch.ones(max_batch, dtype=torch.int32)  # padded rows: kv_len 1 on the null page
    qo_indptr = torch.zeros(max_batch + 1, dtype=torch.int32)
    slot_mapping = torch.zeros(num_rows, dtype=torch.int64)
    q = torch.randn(num_rows, hq, HEAD_DIM, generator=gen)
    k = torch.randn(num_rows, hkv, HEAD_DIM, generator=gen)
    v = torch.randn(num_rows, hkv, HEAD_DIM, generator=gen)
    full_k, full_v, start = [], [], 0
    cache = backend.kv_caches[LAYER]
    for seq, (prior, qo_len) in enumerate(specs):
        kv_len = prior + qo_len
        pages = [free_pages.pop() for _ in range(-(-kv_len // PAGE_SIZE))]
        page_table[seq, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        slots = torch.tensor([pages[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for p in range(kv_len)])
        prior_k = torch.randn(prior, hkv, HEAD_DIM, generator=gen)
        prior_v = torch.randn(prior, hkv, HEAD_DIM, generator=gen)
        cache[slots[:prior] // PAGE_SIZE, 0, slots[:prior] % PAGE_SIZE] = prior_k.to(dev, cache.dtype)
        cache[slots[:prior] // PAGE_SIZE, 1, slots[:prior] % PAGE_SIZE] = prior_v.to(dev, cache.dtype)
        slot_mapping[start : start + qo_len] = slots[prior:]
        full_k.append(torch.cat([prior_k, k[start : start + qo_len]]))
        full_v.append(torch.cat([prior_v, v[start : start + qo_len]]))
        kv_lens[seq] = kv_len
        start += qo_len
        qo_indptr[seq + 1] = start
    qo_indptr[len(specs) + 1 :] = start
    decode = all(qo == 1 for _, qo in specs)
    plan = AttentionPlan(len(specs), [s[1] for s in specs], [s[0] + s[1] for s in specs], decode=decode)
    bufs = AttentionBuffers(page_table.to(dev), kv_lens.to(dev), qo_indptr.to(dev), slot_mapping.to(dev))
    return Step(plan, bufs, q.to(dev), k.to(dev), v.to(dev), full_k, full_v)


def reference(q: torch.Tensor, full_k: torch.Tensor, full_v: torch.Tensor) -> torch.Tensor:
    """Dense causal attention in float64; q [qo, Hq, D], full_k/v [kv, Hkv, D] -> [qo, Hq, D]."""
    qo_len, hq, d = q.shape
    kv_len, hkv, _ = full_k.shape
    k = full_k.double().repeat_interleave(hq // hkv, dim=1)
    v = full_v.double().repeat_interleave(hq // hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) / d**0.5
    visible = torch.arange(kv_len)[None, :] <= torch.arange(kv_len - qo_len, kv_len)[:, None]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def plan_inputs(bufs: AttentionBuffers) -> PlanInputs:
    """What the torch backend's planner reads (it needs no host CSR offsets)."""
    return PlanInputs(None, None, None, None, max_pages_per_seq=bufs.page_table.shape[1])


def run(backend, step: Step) -> torch.Tensor:
    backend.plan(step.plan, plan_inputs(step.bufs))
    return backend.forward(LAYER, step.q, step.k, step.v, step.bufs)


def assert_matches_reference(out: torch.Tensor, step: Step, tol: float = 1e-5) -> None:
    start = 0
    for seq, qo_len in enumerate(step.plan.qo_lens):
        expected = reference(step.q[start : start + qo_len].cpu(), step.full_k[seq], step.full_v[seq])
        torch.testing.assert_close(out[start : start + qo_len].cpu().double(), expected, atol=tol, rtol=tol)
        start += qo_len


def expected_cache_after(before: torch.Tensor, step: Step, num_rows: int) -> torch.Tensor:
    expected = before.clone()
    slots = step.bufs.slot_mapping[:num_rows]
    expected[slots // PAGE_SIZE, 0, slots % PAGE_SIZE] = step.k[:num_rows].to(expected.dtype)
    expected[slots // PAGE_SIZE, 1, slots % PAGE_SIZE] = step.v[:num_rows].to(expected.dtype)
    return expected


# fresh prefill, chunked prefill over prior context, a decode-like row, ragged page boundaries
MIXED_SPECS = [(0, 5), (7, 3), (13, 1), (2, 9), (0, 1), (8, 4)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hq, hkv", [(8, 2), (4, 4), (8, 1)])
def test_mixed_batch_matches_dense_reference(hq: int, hkv: int, device: str) -> None:
    backend = make_backend(hq, hkv, device)
    num_tokens = sum(qo for _, qo in MIXED_SPECS)
    step = make_step(backend, MIXED_SPECS, num_rows=num_tokens)
    assert not step.plan.is_decode and step.plan.num_tokens == num_tokens
    assert_matches_reference(run(backend, step), step)


def test_mixed_batch_writes_kv_exactly_at_slot_mapping() -> None:
    backend = make_backend()
    num_tokens = sum(qo for _, qo in MIXED_SPECS)
    step = make_step(backend, MIXED_SPECS, num_rows=num_tokens)
    before = [cache.clone() for cache in backend.kv_caches]
    run(backend, step)
    assert torch.equal(backend.kv_caches[0], before[0])
    assert torch.equal(backend.kv_caches[LAYER], expected_cache_after(before[LAYER], step, num_tokens))


def test_mixed_batch_padded_rows_write_only_null_page() -> None:
    backend = make_backend()
    num_tokens = sum(qo for _, qo in MIXED_SPECS)
    step = make_step(backend, MIXED_SPECS, num_rows=num_tokens + 3)
    before = backend.kv_caches[LAYER].clone()
    out = run(backend, step)
    assert out.shape == step.q.shape and torch.isfinite(out).all()
    assert_matches_reference(out, step)
    expected = expected_cache_after(before, step, num_tokens)
    assert torch.equal(backend.kv_caches[LAYER][1:], expected[1:])
    assert torch.equal(backend.kv_caches[LAYER][0, :, 1:], before[0, :, 1:])


DECODE_SPECS = [(0, 1), (6, 1), (15, 1), (28, 1), (3, 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hq, hkv", [(8, 2), (4, 4)])
def test_decode_with_padded_rows(hq: int, hkv: int, device: str) -> None:
    backend = make_backend(hq, hkv, device)
    step = make_step(backend, DECODE_SPECS, num_rows=8)
    assert step.plan.is_decode
    before = backend.kv_caches[LAYER].clone()
    out = run(backend, step)
    assert out.shape == (8, hq, HEAD_DIM) and torch.isfinite(out).all()
    assert_matches_reference(out, step)
    # Real rows wrote their slots; padded rows touched only slot 0 of the null page.
    expected = expected_cache_after(before, step, len(DECODE_SPECS))
    assert torch.equal(backend.kv_caches[LAYER][1:], expected[1:])
    assert torch.equal(backend.kv_caches[LAYER][0, :, 1:], before[0, :, 1:])
    padded_k = step.k[len(DECODE_SPECS) :]  # [rows, kv_heads, head_dim]: each head's entry is one padded row's
    for h in range(hkv):  # (heads are written independently on GPUs, so different rows may win per head)
        assert any(torch.equal(backend.kv_caches[LAYER][0, 0, 0, h], row[h]) for row in padded_k)


def test_decode_row_with_nothing_visible_stays_finite() -> None:
    # Not produced by a valid plan, but a stray kv_len 0 in a padded row must not put NaN into
    # the batch (NaN would spread through later layers' shared ops, e.g. batched norms).
    backend = make_backend()
    step = make_step(backend, [(5, 1)], num_rows=3)
    step.bufs.kv_lens[1:3] = 0
    out = run(backend, step)
    assert torch.isfinite(out).all()
    assert_matches_reference(out, step)


def test_decode_bucket_rounds_to_power_of_two_pages_and_matches_full_width() -> None:
    backend = make_backend()
    step = make_step(backend, [(4, 1), (10, 1)], num_rows=4)  # longest kv_len 11 -> 3 pages -> 4
    out_bucketed = run(backend, step)
    assert backend.decode_num_pages == 4
    backend.decode_num_pages = None  # what graph capture does: gather every page-table column
    out_full = backend.forward(LAYER, step.q, step.k, step.v, step.bufs)
    torch.testing.assert_close(out_bucketed, out_full)
    assert_matches_reference(out_bucketed, step)


def test_decode_bucket_is_capped_at_page_table_width() -> None:
    backend = make_backend()
    step = make_step(backend, [(30, 1), (2, 1)], num_rows=2, max_pages=8)  # 31 tokens -> 8 pages
    assert_matches_reference(run(backend, step), step)
    assert backend.decode_num_pages == 8


def test_bfloat16_cache_stays_close_to_reference() -> None:
    backend = make_attention_backend("torch", **{**backend_kwargs(), "dtype": torch.bfloat16})
    num_tokens = sum(qo for _, qo in MIXED_SPECS)
    step = make_step(backend, MIXED_SPECS, num_rows=num_tokens)
    out = run(backend, step)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert_matches_reference(out, step, tol=5e-2)


def test_plan_properties_and_validation() -> None:
    assert AttentionPlan(2, [1, 1], [5, 1], decode=True).is_decode
    assert not AttentionPlan(2, [1, 1], [5, 1]).is_decode  # a prefill of one-token prompts stays a prefill
    mixed = AttentionPlan(2, [3, 1], [3, 9])
    assert not mixed.is_decode and mixed.num_tokens == 4
    with pytest.raises(ValueError):
        AttentionPlan(2, [1], [1])
    with pytest.raises(ValueError):
        AttentionPlan(1, [4], [3])


def test_decode_rows_is_the_checked_decode_plan() -> None:
    """The writer's unchecked decode plan has every field the checked constructor sets, with equal values."""
    kv = np.array([5, 1, 17], dtype=np.int64)
    fast, checked = AttentionPlan.decode_rows(kv), AttentionPlan(3, np.ones(3), kv, num_rows=3, decode=True)
    assert set(vars(fast)) == {f.name for f in fields(AttentionPlan)}
    for name, value in vars(checked).items():
        assert np.array_equal(vars(fast)[name], value) and np.asarray(vars(fast)[name]).dtype == np.asarray(value).dtype
    assert fast.is_decode and fast.num_tokens == 3 and not fast.qo_lens.flags.writeable
    with pytest.raises(ValueError, match="kv_len >= 1"):
        AttentionPlan.decode_rows(np.array([3, 0]))
    assert AttentionPlan.decode_rows(np.zeros(0, dtype=np.int64)).num_seqs == 0


def test_factory() -> None:
    assert make_attention_backend("auto", **backend_kwargs()).name == "torch"
    with pytest.raises(RuntimeError, match="flashinfer backend not available"):
        make_attention_backend("flashinfer", **backend_kwargs())
    with pytest.raises(ValueError):
        make_attention_backend("nope", **backend_kwargs())
    backend = make_attention_backend("torch", **backend_kwargs())
    assert backend.kv_caches[0].shape == (NUM_PAGES, 2, PAGE_SIZE, 2, HEAD_DIM)
    assert backend.memory_bytes() == 2 * NUM_PAGES * 2 * PAGE_SIZE * 2 * HEAD_DIM * 4


def backend_kwargs() -> dict:
    return dict(
        num_layers=2,
        num_pages=NUM_PAGES,
        page_size=PAGE_SIZE,
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        dtype=torch.float32,
        device="cpu",
    )


@pytest.mark.gpu
@needs_cuda
def test_decode_cuda_graph_equals_eager() -> None:
    backend = make_backend(device="cuda")
    # Capture with short sequences (eager bucket would be 1 page) ...
    step = make_step(backend, [(0, 1), (2, 1), (1, 1)], num_rows=6, seed=1)
    q, k, v = step.q.clone(), step.k.clone(), step.v.clone()
    backend.plan(step.plan, plan_inputs(step.bufs))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        backend.forward(LAYER, q, k, v, step.bufs)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = backend.forward(LAYER, q, k, v, step.bufs)
    # ... then replay over much longer ones, refilling the static buffers in place.
    long_step = make_step(backend, [(27, 1), (9, 1), (30, 1)], num_rows=6, seed=2)
    statics = (q, k, v, *vars(step.bufs).values())
    news = (long_step.q, long_step.k, long_step.v, *vars(long_step.bufs).values())
    for static, new in zip(statics, news, strict=True):
        if static is not None:  # the host-planner fields are unused by the torch backend
            static.copy_(new)
    backend.plan(long_step.plan, plan_inputs(step.bufs))
    before = backend.kv_caches[LAYER].clone()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(graph_out).all()
    assert_matches_reference(graph_out, long_step)
    after_graph = backend.kv_caches[LAYER].clone()
    backend.kv_caches[LAYER].copy_(before)
    eager_out = backend.forward(LAYER, q, k, v, step.bufs)
    torch.testing.assert_close(graph_out[:3], eager_out[:3], atol=1e-5, rtol=1e-5)
    assert torch.equal(after_graph[1:], backend.kv_caches[LAYER][1:])


def test_paged_kv_csr_lists_each_rows_used_pages_in_order() -> None:
    """Host offsets (paged_kv_offsets) and the stage's device-side page indices (_kv_indices) together
    form the CSR that host planners read: each row's used pages in order."""
    table = np.array([[7, 3, 9, 0], [5, 0, 0, 0], [0, 0, 0, 0], [2, 4, 6, 8]], dtype=np.int32)
    kv_lens = np.array([33, 16, 1, 64], dtype=np.int32)  # pages used: 3, 1, 1 (a padded row), 4
    indptr, last = np.full(5, -1, np.int32), np.full(4, -1, np.int32)
    n = paged_kv_offsets(kv_lens, 16, indptr, last)
    assert n == 9 and indptr.tolist() == [0, 3, 4, 5, 9] and last.tolist() == [1, 16, 1, 16]
    indices = torch.full((16,), -1, dtype=torch.int32)
    _kv_indices(torch.from_numpy(table), torch.from_numpy(indptr), indices)
    assert indices[:n].tolist() == [7, 3, 9, 5, 0, 2, 4, 6, 8] and indices[n:].tolist() == [0] * 7
    # The same pages as the page table walked per position, which is what the torch backend reads.
    for row in range(4):
        positions = np.arange(kv_lens[row])
        assert set(table[row, positions // 16]) == set(indices[indptr[row] : indptr[row + 1]].tolist())

"""PagePool / SlotPool: invariants under random use, capacity math, all-or-nothing reservation."""

import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from vox_serve.core.page_pool import OutOfPages, OutOfSlots, PagePool, SlotPool


def snapshot(pool: PagePool) -> tuple:
    return (pool.num_free, {o: pool.pages(o) for o in pool.owners()})


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_capacity_is_ceil_of_tokens_over_page_size(page_size: int) -> None:
    pool = PagePool(num_pages=200, page_size=page_size)
    for num_tokens in range(0, 3 * page_size + 2):
        expected = -(-num_tokens // page_size)
        assert pool.pages_needed("fresh", num_tokens) == expected
    new = pool.reserve("a", 2 * page_size + 1)
    assert len(new) == 3
    assert pool.num_tokens_capacity("a") == 3 * page_size
    # Growing within capacity adds nothing; one more token past it adds exactly one page.
    assert pool.pages_needed("a", 3 * page_size) == 0
    assert pool.reserve("a", page_size) == []
    assert pool.pages_needed("a", 3 * page_size + 1) == 1
    extra = pool.reserve("a", 3 * page_size + 1)
    assert len(extra) == 1 and pool.pages("a") == new + extra
    pool.check()


def test_reserved_pages_are_never_handed_out() -> None:
    pool = PagePool(num_pages=10, page_size=2, num_reserved=3)
    assert pool.num_usable == 7 and pool.num_free == 7
    pages = pool.reserve("a", 14)
    assert sorted(pages) == list(range(3, 10))
    assert not pool.can_reserve("b", 1)
    pool.check()


def test_out_of_pages_leaves_state_unchanged() -> None:
    pool = PagePool(num_pages=9, page_size=4)
    pool.reserve("a", 10)
    pool.reserve("b", 4)
    before = snapshot(pool)
    assert not pool.can_reserve("a", 4 * 8)
    with pytest.raises(OutOfPages):
        pool.reserve("a", 4 * 8)
    with pytest.raises(OutOfPages):
        pool.reserve("new", 4 * 6)
    assert snapshot(pool) == before
    assert "new" not in pool.owners()
    pool.check()


def test_free_returns_every_page_and_unknown_owner_is_noop() -> None:
    pool = PagePool(num_pages=33, page_size=8)
    pool.reserve("a", 50)
    pool.reserve("b", 3)
    assert pool.free("a") == 7
    assert pool.free("a") == 0
    assert pool.free("never") == 0
    assert pool.free("b") == 1
    assert pool.num_free == pool.num_usable == 32 and pool.num_owners == 0
    pool.check()


def test_freed_pages_are_reused() -> None:
    pool = PagePool(num_pages=5, page_size=1)
    first = pool.reserve("a", 4)
    pool.free("a")
    assert sorted(pool.reserve("b", 4)) == sorted(first)


def test_pages_returns_a_copy() -> None:
    pool = PagePool(num_pages=5, page_size=1)
    pool.reserve("a", 2)
    pool.pages("a").append(0)
    assert len(pool.pages("a")) == 2
    pool.check()


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda p: p._free.append(p._free[0]), "duplicate"),
        (lambda p: p._owned["a"].append(p._owned["b"][0]), "owned by both"),
        (lambda p: p._owned["a"].append(0), "reserved page 0"),
        (lambda p: p._free.append(0), "reserved page 0"),
        (lambda p: p._free.pop(), "!= usable"),
        (lambda p: p._free.append(p._owned["a"][0]), "both free and owned"),
    ],
)
def test_check_detects_corruption(corrupt, message: str) -> None:
    pool = PagePool(num_pages=16, page_size=2)
    pool.reserve("a", 5)
    pool.reserve("b", 3)
    pool.check()
    corrupt(pool)
    with pytest.raises(AssertionError, match=message):
        pool.check()


def test_random_reserve_extend_free_keeps_invariants() -> None:
    rng = random.Random(1234)
    pool = PagePool(num_pages=64, page_size=4, num_reserved=2)
    tokens: dict[int, int] = {}  # model of how many tokens each owner asked for
    for _ in range(5000):
        owner = rng.randrange(12)
        if rng.random() < 0.25:
            assert pool.free(owner) == -(-tokens.pop(owner, 0) // 4)
        else:
            want = tokens.get(owner, 0) + rng.randrange(0, 20)
            before = snapshot(pool)
            needed = pool.pages_needed(owner, want)
            if pool.can_reserve(owner, want):
                new = pool.reserve(owner, want)
                assert len(new) == needed and all(p >= 2 for p in new)
                tokens[owner] = want
            else:
                with pytest.raises(OutOfPages):
                    pool.reserve(owner, want)
                assert snapshot(pool) == before
        pool.check()
        for o, n in tokens.items():
            assert pool.num_tokens_capacity(o) >= n > pool.num_tokens_capacity(o) - 4 or n == 0
        assert pool.num_free == pool.num_usable - sum(len(pool.pages(o)) for o in pool.owners())


class PagePoolMachine(RuleBasedStateMachine):
    """Hypothesis explores interleavings; the model is the token count each owner asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = PagePool(num_pages=20, page_size=3, num_reserved=1)
        self.tokens: dict[int, int] = {}

    @rule(owner=st.integers(0, 5), more=st.integers(0, 25))
    def reserve(self, owner: int, more: int) -> None:
        want = self.tokens.get(owner, 0) + more
        if self.pool.can_reserve(owner, want):
            self.pool.reserve(owner, want)
            self.tokens[owner] = want
        else:
            before = snapshot(self.pool)
            with pytest.raises(OutOfPages):
                self.pool.reserve(owner, want)
            assert snapshot(self.pool) == before

    @rule(owner=st.integers(0, 5))
    def free(self, owner: int) -> None:
        expected = -(-self.tokens.pop(owner, 0) // 3)
        assert self.pool.free(owner) == expected

    @invariant()
    def consistent(self) -> None:
        self.pool.check()
        assert set(self.pool.owners()) == set(self.tokens)
        for owner, n in self.tokens.items():
            assert self.pool.pages_needed(owner, n) == 0
            assert len(self.pool.pages(owner)) == -(-n // 3)
            assert 0 not in self.pool.pages(owner)


TestPagePoolMachine = PagePoolMachine.TestCase
TestPagePoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_slot_pool_acquire_release() -> None:
    slots = SlotPool(3)
    a = slots.acquire("a")
    assert slots.acquire("a") == a and slots.slot("a") == a
    b, c = slots.acquire("b"), slots.acquire("c")
    assert sorted([a, b, c]) == [0, 1, 2]
    assert not slots.can_acquire() and slots.num_free == 0
    with pytest.raises(OutOfSlots):
        slots.acquire("d")
    slots.check()
    assert slots.release("b") is True
    assert slots.release("b") is False and slots.slot("b") is None
    assert slots.can_acquire()
    assert slots.acquire("d") == b
    slots.check()


def test_slot_pool_random_use_keeps_invariants() -> None:
    rng = random.Random(7)
    slots = SlotPool(5)
    held: dict[int, int] = {}
    for _ in range(2000):
        owner = rng.randrange(9)
        if rng.random() < 0.4:
            assert slots.release(owner) == (held.pop(owner, None) is not None)
        elif owner in held or slots.can_acquire():
            held[owner] = slots.acquire(owner)
        else:
            with pytest.raises(OutOfSlots):
                slots.acquire(owner)
        slots.check()
        assert len(set(held.values())) == len(held) and slots.num_free == 5 - len(held)


def test_slot_pool_check_detects_corruption() -> None:
    slots = SlotPool(4)
    slots.acquire("a")
    slots._free.append(slots.slot("a"))
    with pytest.raises(AssertionError, match="both free and held"):
        slots.check()


def test_page_pool_module_does_not_import_torch() -> None:
    code = "import sys, vox_serve.core.page_pool; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])

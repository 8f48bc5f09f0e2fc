"""Host-side bookkeeping of KV-cache pages and codec streaming-state slots.

Pure Python on purpose: the scheduler (which must not import torch) decides admission with these
pools, and the worker only reads the page ids they hand out. Every mutating method comes with a
side-effect-free check (`can_reserve` / `reserve`, `can_acquire` / `acquire`) so policies can ask
"would this fit?" without rolling anything back.
"""

from __future__ import annotations

from collections.abc import Hashable


class OutOfPages(RuntimeError):
    """Raised by `PagePool.reserve` when the free list is too short; the pool is left unchanged."""


class OutOfSlots(RuntimeError):
    """Raised by `SlotPool.acquire` when every slot is taken; the pool is left unchanged."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class PagePool:
    """Fixed set of KV pages of `page_size` tokens, handed out to owners (request ids).

    Pages `0 .. num_reserved-1` are never handed out: page 0 is the null page that padded batch
    rows write their K/V into, so a real request's cache can never be clobbered by padding.
    Freed pages go on a LIFO free list, so allocation and freeing cost O(pages touched).

    With `kv_streams` > 1 an owner holds that many KV sequences of equal length (paired rows for
    classifier-free guidance): every block of `page_size` positions takes one page per stream, and an
    owner's pages are listed block by block, stream by stream within a block. Counts of pages
    (`num_free`, `pages_needed`, ...) are pages, not blocks.
    """

    def __init__(self, num_pages: int, page_size: int, num_reserved: int = 1, kv_streams: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if not 0 <= num_reserved <= num_pages:
            raise ValueError(f"need 0 <= num_reserved ({num_reserved}) <= num_pages ({num_pages})")
        if kv_streams < 1:
            raise ValueError(f"kv_streams must be >= 1, got {kv_streams}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_reserved = num_reserved
        self.kv_streams = kv_streams
        # Reversed so that pop() hands out the lowest page ids first (easier to read in logs).
        self._free: list[int] = list(range(num_pages - 1, num_reserved - 1, -1))
        self._owned: dict[Hashable, list[int]] = {}

    # -- queries ---------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_usable(self) -> int:
        """Pages that can ever be handed out (total minus reserved)."""
        return self.num_pages - self.num_reserved

    @property
    def num_owners(self) -> int:
        return len(self._owned)

    def owners(self) -> list[Hashable]:
        return list(self._owned)

    def pages(self, owner: Hashable) -> list[int]:
        """The owner's pages in sequence order (a copy; empty for an unknown owner)."""
        return list(self._owned.get(owner, ()))

    def num_tokens_capacity(self, owner: Hashable) -> int:
        """Positions each of the owner's KV streams holds."""
        return self.num_blocks(owner) * self.page_size

    def num_blocks(self, owner: Hashable) -> int:
        """Blocks of page_size positions the owner holds (a page per stream each)."""
        return len(self._owned.get(owner, ())) // self.kv_streams

    def pages_needed(self, owner: Hashable, num_tokens: int) -> int:
        """Extra pages `owner` needs so that each of its streams can hold `num_tokens` tokens in total."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return self.kv_streams * max(0, _ceil_div(num_tokens, self.page_size) - self.num_blocks(owner))

    def can_reserve(self, owner: Hashable, num_tokens: int) -> bool:
        return self.pages_needed(owner, num_tokens) <= len(self._free)

    # -- mutations -------------------------------------------------------------------------------

    def reserve(self, owner: Hashable, num_tokens: int) -> list[int]:
        """Grow `owner`'s page list to hold `num_tokens` tokens per stream; return only the newly added
        pages (block by block, a page per stream within a block).

        Never shrinks: asking for fewer tokens than the current capacity adds nothing. Registers
        the owner even when no page is needed, so `free` later finds it.
        """
        needed = self.pages_needed(owner, num_tokens)
        if needed > len(self._free):
            raise OutOfPages(
                f"owner {owner!r} needs {needed} more pages for {num_tokens} tokens, "
                f"only {len(self._free)} free"
            )
        new_pages = [self._free.pop() for _ in range(needed)]
        self._owned.setdefault(owner, []).extend(new_pages)
        return new_pages

    def extend_each(self, owners: list[Hashable]) -> list[int]:
        """One more block for each owner (existing owners; at most one entry each), in order: kv_streams
        pages per owner, owner by owner; the pages handed out are the ones successive `reserve` calls
        would give. OutOfPages if too few are free."""
        s = self.kv_streams
        n = len(owners) * s
        if n > len(self._free):
            raise OutOfPages(f"{len(owners)} owners need {s} page(s) each, only {len(self._free)} free")
        pages = self._free[len(self._free) - n:][::-1]
        del self._free[len(self._free) - n:]
        owned = self._owned
        if s == 1:
            for owner, page in zip(owners, pages, strict=True):
                owned[owner].append(page)
        else:
            for i, owner in enumerate(owners):
                owned[owner].extend(pages[i * s : (i + 1) * s])
        return pages

    def free(self, owner: Hashable) -> int:
        """Return all of `owner`'s pages to the pool; unknown owners are a no-op returning 0."""
        owned = self._owned.pop(owner, None)
        if owned is None:
            return 0
        # Pushed in reverse so the owner's first page is the next one handed out again.
        self._free.extend(reversed(owned))
        return len(owned)

    # -- integrity -------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise AssertionError describing the first broken invariant, if any."""
        free_set = set(self._free)
        assert len(free_set) == len(self._free), "free list has duplicate pages"
        seen: dict[int, Hashable] = {}
        for owner, owned in self._owned.items():
            for page in owned:
                assert page not in seen, f"page {page} owned by both {seen[page]!r} and {owner!r}"
                seen[page] = owner
        for page in list(free_set) + list(seen):
            assert 0 <= page < self.num_pages, f"page {page} out of range [0, {self.num_pages})"
            assert page >= self.num_reserved, f"reserved page {page} is free or owned"
        both = free_set & seen.keys()
        assert not both, f"pages both free and owned: {sorted(both)}"
        assert len(free_set) + len(seen) == self.num_usable, (
            f"free ({len(free_set)}) + owned ({len(seen)}) != usable ({self.num_usable})"
        )
        for owner, owned in self._owned.items():
            assert len(owned) % self.kv_streams == 0, f"{owner!r} holds {len(owned)} pages, not whole blocks"


class SlotPool:
    """Fixed set of codec streaming-state slots `0 .. num_slots-1`, one per owner."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 0:
            raise ValueError(f"num_slots must be >= 0, got {num_slots}")
        self.num_slots = num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._slots: dict[Hashable, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_acquire(self) -> bool:
        return bool(self._free)

    def slot(self, owner: Hashable) -> int | None:
        return self._slots.get(owner)

    def acquire(self, owner: Hashable) -> int:
        """The owner's slot, taking a free one on first use (idempotent per owner)."""
        if owner in self._slots:
            return self._slots[owner]
        if not self._free:
            raise OutOfSlots(f"no free codec slot for owner {owner!r} ({self.num_slots} in use)")
        slot = self._free.pop()
        self._slots[owner] = slot
        return slot

    def release(self, owner: Hashable) -> bool:
        """Give the owner's slot back; False if it held none."""
        slot = self._slots.pop(owner, None)
        if slot is None:
            return False
        self._free.append(slot)
        return True

    def check(self) -> None:
        """Raise AssertionError describing the first broken invariant, if any."""
        free_set = set(self._free)
        assert len(free_set) == len(self._free), "free slot list has duplicates"
        held = list(self._slots.values())
        assert len(set(held)) == len(held), "a slot is held by two owners"
        both = free_set & set(held)
        assert not both, f"slots both free and held: {sorted(both)}"
        every = free_set | set(held)
        assert all(0 <= s < self.num_slots for s in every), "slot id out of range"
        assert len(every) == self.num_slots, f"{self.num_slots - len(every)} slots lost"

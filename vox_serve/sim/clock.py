"""A virtual clock: time moves only when the simulated engine or the driver moves it."""

from __future__ import annotations


class VirtualClock:
    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    __call__ = now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"time cannot go back ({seconds} s)")
        self._now += seconds

    def advance_to(self, when: float) -> None:
        """Move to `when` if it is later than now."""
        self._now = max(self._now, when)

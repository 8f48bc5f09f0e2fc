"""Progress on stderr for `--bench-requests`: start-up stages as they run, then requests and tokens.

On a terminal one status line is redrawn in place (a bar, requests done, tokens generated of the most
the requests may generate, audio so far); otherwise (a log, CI) a plain line is printed every
LOG_INTERVAL_S, so a slow run still shows that it moves.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

BAR_WIDTH = 24
REDRAW_INTERVAL_S = 0.2
LOG_INTERVAL_S = 5.0


class Progress:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.start = time.perf_counter()
        self._last_draw = -1e9

    @contextmanager
    def stage(self, name: str, what: str) -> Iterator[None]:
        """Say a start-up stage begins, then how long it took."""
        self._print(f"vox-serve: {name}: {what} ...", end="" if self.live else "\n")
        t0 = time.perf_counter()
        yield
        done = f"{name} done in {time.perf_counter() - t0:.1f}s"
        self._print(f" {done}" if self.live else f"vox-serve: {done}")

    def requests(self, done: int, total: int, tokens: int, max_tokens: int, audio_s: float,
                 final: bool = False) -> None:
        """The run's state; drawn at most every REDRAW_INTERVAL_S (LOG_INTERVAL_S without a terminal)."""
        now = time.perf_counter()
        if not final and now - self._last_draw < (REDRAW_INTERVAL_S if self.live else LOG_INTERVAL_S):
            return
        self._last_draw = now
        filled = BAR_WIDTH * tokens // max(max_tokens, 1) if done < total else BAR_WIDTH
        line = (f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {done}/{total} requests, {tokens}/{max_tokens} "
                f"tokens, {audio_s:.1f}s audio, {now - self.start:.1f}s")
        if self.live:
            self._print(f"\r{line}", end="\n" if final else "")
        else:
            self._print(f"vox-serve: {line}")

    def _print(self, text: str, end: str = "\n") -> None:
        print(text, end=end, file=self.stream, flush=True)

"""Prompt building off the engine loop's thread.

A replica builds prompts -- tokenizing, and for voice cloning running the reference-audio encoders
on the GPU -- in a worker thread, on a CUDA stream of its own, so a clip being encoded never stalls
the steps of running streams. Finished prompts are collected by the loop between steps; a wake-up
callback (a ZMQ socket in the replica) interrupts the loop's wait for messages when one is ready.
With `threads=0` prompts are built inline, at submit time (bench mode and unit tests).
"""

from __future__ import annotations

import queue
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

SWITCH_INTERVAL_S = 0.0005  # the loop thread waits at most this long for the GIL while a prompt is built


class PromptPool:
    def __init__(self, threads: int = 1, device: str | None = None, wake: Callable[[], None] | None = None) -> None:
        self._done: queue.SimpleQueue[tuple[str, Future]] = queue.SimpleQueue()
        self._wake = wake
        self._pool = None
        if threads > 0:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="prompts",
                                            initializer=_own_stream, initargs=(device,))
        self.num_pending = 0

    def submit(self, key: str, build: Callable[[], Any]) -> None:
        """Build in the pool; `completed()` returns (key, future) once done."""
        self.num_pending += 1
        if self._pool is None:
            future: Future = Future()
            try:
                future.set_result(build())
            except Exception as exc:  # delivered like a pool's: the caller reads future.exception()
                future.set_exception(exc)
            self._done.put((key, future))
            return
        future = self._pool.submit(build)
        future.add_done_callback(lambda f: self._finished(key, f))

    def warm(self, build: Callable[[], Any], timeout_s: float = 120.0) -> None:
        """Run `build` once in the pool and wait: the thread, its CUDA stream and whatever the first
        prompt initialises lazily are ready before the first request instead of in its TTFA."""
        if self._pool is None:
            build()
        else:
            self._pool.submit(build).result(timeout=timeout_s)

    def _finished(self, key: str, future: Future) -> None:
        self._done.put((key, future))
        if self._wake is not None:
            self._wake()

    def completed(self) -> list[tuple[str, Future]]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                self.num_pending -= len(out)
                return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _own_stream(device: str | None) -> None:
    """The pool thread's default CUDA stream: its encoders overlap the engine's launches."""
    if device is None or not device.startswith("cuda"):
        return
    import torch

    torch.cuda.set_stream(torch.cuda.Stream(torch.device(device)))

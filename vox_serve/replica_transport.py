"""A scheduler process's link to the API process (scheduler_entry.py): its ZMQ sockets, and the
heartbeat thread that reports the process alive during long steps too."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import zmq

from vox_serve import ipc

log = logging.getLogger("vox_serve.scheduler_entry")

STATS_INTERVAL_S = 0.2  # how often a replica reports its load and sends a heartbeat


class Connection:
    """The replica's two sockets: PULL (bound) for the API's messages, PUSH to the API's PULL; and a pipe
    that wakes the loop's wait for messages when a prompt is ready (`wake`, called from the prompt pool)."""

    def __init__(self, bind: str, api: str) -> None:
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(bind)
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.SNDHWM, 0)  # never block a step on a slow reader
        self.push.connect(api)
        self.api = api
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self.poller = zmq.Poller()
        self.poller.register(self.pull, zmq.POLLIN)
        self.poller.register(self._wake_read, zmq.POLLIN)

    def wake(self) -> None:
        os.write(self._wake_write, b"w")

    def send(self, msg: Any) -> None:
        self.push.send_multipart(ipc.encode(msg), copy=False)

    def receive(self, timeout_s: float) -> list[Any]:
        """Every message waiting, after waiting up to timeout_s for the first one (or a wake-up)."""
        out: list[Any] = []
        ready = dict(self.poller.poll(int(timeout_s * 1000)))
        if self._wake_read in ready:
            try:
                os.read(self._wake_read, 4096)
            except BlockingIOError:
                pass
        if self.pull not in ready:
            return out
        while True:
            try:
                frames = self.pull.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                out.append(ipc.decode(frames))
            except ipc.ProtocolError as exc:
                log.error("dropping a malformed message: %s", exc)

    def close(self, linger_s: float = 1.0) -> None:
        self.pull.close(linger=0)
        self.push.close(linger=int(linger_s * 1000))
        self.ctx.term()
        os.close(self._wake_read)
        os.close(self._wake_write)


class Heartbeat:
    """A daemon thread with its own socket (ZMQ sockets are not shared between threads) that tells the
    API every STATS_INTERVAL_S that the process lives, and how long the loop's current step has run:
    the API tells a frozen process (no heartbeat) from one stuck in a step (a step that never ends)
    from one that is merely busy, without the loop having to report between steps."""

    def __init__(self, conn: Connection, replica: int, incarnation: int) -> None:
        self.step_started: float | None = None  # set by the loop around each step
        self._stop = threading.Event()
        self._socket = conn.ctx.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, 0)
        self._socket.connect(conn.api)
        self._ids = (replica, incarnation)
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(STATS_INTERVAL_S):
            started = self.step_started
            step_s = 0.0 if started is None else time.monotonic() - started
            self._socket.send_multipart(ipc.encode(ipc.Heartbeat(*self._ids, step_s=round(step_s, 3))))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close(linger=0)

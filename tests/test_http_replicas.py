"""Several replicas (--dp-size 2 on CPU): load is spread, and a replica whose process dies fails its
requests promptly, turns /health 503, and is restarted while the other keeps serving."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_harness import Server, error_of, generate_concurrently, running_server, wait_until

LONG = {"text": "A long request.", "max_tokens": 5000, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("http-replicas"), "--dp-size", "2") as srv:
        yield srv


def test_dp2_spreads_load_over_both_replicas(server: Server) -> None:
    replicas = server.replicas()
    assert [r["replica"] for r in replicas] == [0, 1] and all(r["state"] == "ready" for r in replicas)
    assert replicas[0]["pid"] != replicas[1]["pid"]
    finished = [r["finished"] for r in replicas]

    responses = generate_concurrently(server, [
        {"text": f"Spread {i}.", "max_tokens": 35, "ignore_eos": True} for i in range(8)
    ])
    assert all(r.status_code == 200 for r in responses)
    served = Counter(int(r.headers["x-replica"]) for r in responses)
    assert served[0] >= 2 and served[1] >= 2, served
    wait_until(server.pools_full, 10.0)
    now = [r["finished"] for r in server.replicas()]
    assert [now[i] - finished[i] for i in (0, 1)] == [served[0], served[1]]


class Stream(threading.Thread):
    """A streaming request read in the background: its replica, bytes, and how it ended."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.replica: int | None = None
        self.received = 0
        self.error: Exception | None = None
        self.ended_at: float | None = None
        self.started = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.server.url, timeout=30.0) as client:
                with client.stream("POST", "/generate", json=LONG) as response:
                    self.replica = int(response.headers["x-replica"])
                    for piece in response.iter_raw():
                        self.received += len(piece)
                        self.started.set()
                        if self.stop.is_set():
                            return
        except Exception as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.started.set()


def test_killed_replica_fails_its_streams_promptly_and_recovers(server: Server) -> None:
    wait_until(server.pools_full, 10.0)
    pids = {r["replica"]: r["pid"] for r in server.replicas()}
    streams = [Stream(server) for _ in range(2)]
    for s in streams:
        s.start()
        assert s.started.wait(30.0)
        time.sleep(0.2)
    assert {s.replica for s in streams} == {0, 1}
    victim = next(s for s in streams if s.replica == 0)
    survivor = next(s for s in streams if s.replica == 1)
    killed_at = time.monotonic()
    os.kill(pids[0], signal.SIGKILL)
    status, body = wait_until(lambda: (h := server.health())[0] == 503 and h, 1.0)
    assert "replica 0" in body["reason"] and "SIGKILL" in body["reason"]
    victim.join(5.0)
    assert isinstance(victim.error, httpx.RemoteProtocolError), victim.error  # cut off, not ended cleanly
    assert victim.ended_at - killed_at < 5.0  # at once, not after the 30 s client timeout
    before = survivor.received
    wait_until(lambda: survivor.received > before + 4096, 10.0)  # replica 1 keeps streaming
    assert survivor.error is None
    survivor.stop.set()
    survivor.join(10.0)
    _, body = wait_until(lambda: (h := server.health())[0] == 200 and h, 60.0)
    restarted = body["replicas"][0]
    assert restarted["restarts"] == 1 and restarted["pid"] not in (None, pids[0])
    assert body["replicas"][1]["pid"] == pids[1]
    _both_replicas_serve(server)


def test_killed_replica_fails_a_whole_request_with_503(server: Server) -> None:
    wait_until(server.pools_full, 10.0)
    result: dict[str, Any] = {}

    def whole() -> None:
        with httpx.Client(base_url=server.url, timeout=30.0) as client:
            result["response"] = client.post("/generate", json={**LONG, "streaming": False})
            result["at"] = time.monotonic()

    thread = threading.Thread(target=whole, daemon=True)
    thread.start()
    holder = wait_until(lambda: next((r for r in server.replicas() if r["active_requests"]), None), 10.0)
    killed_at = time.monotonic()
    os.kill(holder["pid"], signal.SIGKILL)
    thread.join(10.0)
    response = result["response"]
    assert response.status_code == 503 and response.headers["retry-after"]
    assert error_of(response)["type"] == "replica_died"
    assert result["at"] - killed_at < 5.0  # at once, not after the 30 s client timeout
    wait_until(lambda: server.health()[0] == 200, 60.0)
    _both_replicas_serve(server)


def _both_replicas_serve(server: Server) -> None:
    responses = generate_concurrently(server, [
        {"text": f"Back {i}.", "max_tokens": 35, "ignore_eos": True} for i in range(4)
    ])
    assert all(r.status_code == 200 for r in responses)
    assert {int(r.headers["x-replica"]) for r in responses} == {0, 1}
    wait_until(server.pools_full, 10.0)


def test_a_replica_that_cannot_start_stops_the_server_with_its_reason(tmp_path: Path) -> None:
    server = Server(tmp_path, "--model", str(tmp_path / "no-such-checkpoint"))
    try:
        assert server.proc.wait(120.0) == 1
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert "replica 0 could not start" in log and "no-such-checkpoint" in log

"""Overload and time limits: past --max-queued-requests the server answers 503 with Retry-After, and
--request-timeout-s ends every request that runs too long (and frees what it held)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from http_harness import Server, error_of, generate, generate_concurrently, running_server, wait_until

TIMEOUT_S = 3.0
# The overload test's requests run one after another (2-4 s for its first on a loaded two-core host), so
# its server has a limit no run of it comes near; the timeout tests have their own server with TIMEOUT_S.
OVERLOAD_TIMEOUT_S = 120.0


def _limited_server(log_dir: Path, timeout_s: float) -> Iterator[Server]:
    with running_server(log_dir, "--max-batch-size", "1", "--max-queued-requests", "1",
                        "--request-timeout-s", str(timeout_s)) as srv:
        yield srv


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _limited_server(tmp_path_factory.mktemp("http-limits"), TIMEOUT_S)


@pytest.fixture(scope="module")
def overload_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from _limited_server(tmp_path_factory.mktemp("http-overload"), OVERLOAD_TIMEOUT_S)


def _one_running(server: Server) -> bool:
    [replica] = server.replicas()
    return replica["active_requests"] == 1 and replica["waiting_requests"] == 0


def test_overload_answers_503_with_retry_after(overload_server: Server) -> None:
    """One request runs (the batch holds one); of four more sent at once one waits (the queue holds one) and
    the others find the queue full."""
    server = overload_server
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(generate, server, text="Request 0.", max_tokens=300, ignore_eos=True, streaming=False)
        wait_until(lambda: _one_running(server), 30.0)  # admitted: the queue is empty again
        responses = [*generate_concurrently(server, [
            {"text": f"Request {i}.", "max_tokens": 35, "ignore_eos": True, "streaming": False} for i in range(1, 5)
        ]), first.result()]
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= 2 and statuses.count(503) >= 1 and set(statuses) <= {200, 503}, statuses
    for r in responses:
        if r.status_code == 503:
            assert int(r.headers["retry-after"]) >= 1
            assert error_of(r)["type"] == "queue_full"
    wait_until(server.pools_full, 10.0)
    assert server.client.post("/generate", json={"text": "After the rush.", "max_tokens": 35}).status_code == 200


def test_request_timeout_ends_a_whole_request_with_504(server: Server) -> None:
    start = time.monotonic()
    response = server.client.post("/generate", json={"text": "Too long.", "max_tokens": 5000, "ignore_eos": True,
                                                      "streaming": False})
    elapsed = time.monotonic() - start
    assert response.status_code == 504 and error_of(response)["type"] == "timeout", response.text
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 5.0
    wait_until(server.pools_full, 10.0)


def test_request_timeout_cuts_a_stream(server: Server) -> None:
    start = time.monotonic()
    received = 0
    with pytest.raises(httpx.RemoteProtocolError):  # the body ends without its final chunk
        with server.client.stream("POST", "/generate", json={"text": "Too long.", "max_tokens": 5000,
                                                              "ignore_eos": True}) as response:
            assert response.status_code == 200
            for piece in response.iter_raw():
                received += len(piece)
    assert received > 44  # audio did flow before the limit
    assert TIMEOUT_S <= time.monotonic() - start < TIMEOUT_S + 5.0
    wait_until(server.pools_full, 10.0)

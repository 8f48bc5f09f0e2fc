"""A real vox-serve server process for the HTTP tests, and helpers to check what it answers.

The server runs `python -m vox_serve.launch` on CPU with orpheus-tiny in its own process group
(its scheduler processes included), so teardown can always end all of it. Every wait is bounded.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
# One intra-op thread per process: the tests share two cores with other jobs, and oversubscribed
# torch threads make every step many times slower.
BASE_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TINY_FLAGS = ("--runtime", "python", "--model", "orpheus-tiny", "--device", "cpu", "--max-num-pages", "512")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(*paths: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (*map(str, paths), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **BASE_ENV, "PYTHONPATH": path}


def wait_until(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.05) -> Any:
    """The first truthy value of predicate(), polled until timeout_s (then AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(interval_s)


class Server:
    def __init__(self, log_dir: Path, *flags: str, paths: tuple[Path, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"server-{self.port}.log"
        cmd = [sys.executable, "-m", "vox_serve.launch", *TINY_FLAGS, "--host", "127.0.0.1",
               "--port", str(self.port), *flags]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env={**child_env(*paths), **(env or {})}, stdout=log,
                                         stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.client = httpx.Client(base_url=self.url, timeout=60.0)

    def health(self) -> tuple[int, dict[str, Any]]:
        response = self.client.get("/health", timeout=5.0)
        return response.status_code, response.json()

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, body = self.health()
            except httpx.TransportError:
                status, body = 0, {}
            if status == 200:
                return body
            time.sleep(0.2)
        raise RuntimeError(f"server not healthy within {timeout_s}s:\n{self.log_tail()}")

    def replicas(self) -> list[dict[str, Any]]:
        return self.health()[1]["replicas"]

    def pools_full(self) -> bool:
        """Every replica idle with every KV page and codec slot back in its pool."""
        replicas = self.replicas()
        return all(r["active_requests"] == 0 and r["in_flight"] == 0 and r["pools"]
                   and all(p["free"] == p["total"] for p in r["pools"].values()) for r in replicas)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        self._signal(signal.SIGKILL)  # whatever is left of the group (scheduler processes)
        self.proc.wait(STOP_TIMEOUT_S)

    def _signal(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


@contextmanager
def running_server(log_dir: Path, *flags: str, paths: tuple[Path, ...] = (),
                   env: dict[str, str] | None = None) -> Iterator[Server]:
    """A healthy server for the duration of the block, stopped (process group and all) after it.
    `paths` go first on the server's PYTHONPATH; `env` adds to its environment."""
    server = Server(log_dir, *flags, paths=paths, env=env)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def generate(server: Server, timeout: float = 60.0, **fields: Any) -> httpx.Response:
    return server.client.post("/generate", json=fields, timeout=timeout)


def generate_concurrently(server: Server, requests: list[dict[str, Any]],
                          timeout: float = 120.0) -> list[httpx.Response]:
    """POST /generate for every field set at once, one client each; the responses in order."""

    def one(fields: dict[str, Any]) -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=timeout) as client:
            return client.post("/generate", json=fields)

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, requests))


@dataclass
class Wav:
    sample_rate: int
    channels: int
    bits: int
    riff_size: int
    data_size: int
    pcm: bytes


def parse_wav(data: bytes) -> Wav:
    """A 44-byte PCM WAV header, then the samples; checks the layout (not the sizes)."""
    assert len(data) >= 44, f"{len(data)} bytes is shorter than a WAV header"
    assert data[0:4] == b"RIFF" and data[8:12] == b"WAVE" and data[12:16] == b"fmt ", data[:16]
    fmt_size, fmt, channels, rate, byte_rate, block, bits = struct.unpack("<IHHIIHH", data[16:36])
    assert (fmt_size, fmt) == (16, 1), "not a 16-byte PCM fmt chunk"
    assert data[36:40] == b"data"
    assert byte_rate == rate * block and block == channels * bits // 8
    (riff_size,) = struct.unpack("<I", data[4:8])
    (data_size,) = struct.unpack("<I", data[40:44])
    return Wav(rate, channels, bits, riff_size, data_size, data[44:])


# Codec batches differ between runs (which windows share a step); CPU kernels may then sum in another
# order (AVX2 ones do), which moves a sample by an int16 step. Different tokens differ by thousands.
PCM_LSB_ATOL = 2


def pcm_difference(got: bytes, want: bytes) -> int:
    """The largest |difference| between two 16-bit PCM streams of equal length, in int16 steps."""
    assert len(got) == len(want), (len(got), len(want))
    a, b = array.array("h", got), array.array("h", want)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0)


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and {"type", "field", "message"} <= set(body["error"]), body
    return body["error"]


def bench_pcm(tmp: Path, text: str, fields: dict[str, Any], *flags: str) -> bytes:
    """The WAV that `--bench-requests 1` writes for one request."""
    cmd = [sys.executable, "-m", "vox_serve.launch", *TINY_FLAGS, *flags, "--bench-requests", "1",
           "--bench-text", text, "--bench-kwargs", json.dumps(fields), "--bench-out", str(tmp)]
    done = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return (tmp / "bench-000.wav").read_bytes()

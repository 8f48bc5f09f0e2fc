"""What delivering a step's audio to the API process costs the replica's loop: one ZMQ message per chunk
against one AudioBatch per step (the scheduler process's main-thread CPU time, which every step pays).

    python benchmark/audio_ipc.py [--chunks 26] [--chunk-bytes 40000] [--steps 200] [--out FILE]

A PULL socket in another process drains the messages, as the API does. The chunks are views of one block
per step, as `StepReader.read` hands them out (26 chunks of 40,000 bytes: Qwen3-TTS at 256 streams).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vox_serve import ipc  # noqa: E402
from vox_serve.worker.host_memory import keep_freed_buffers  # noqa: E402

STOP = b"stop"


def drain(address: str) -> None:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(address)
    while pull.recv_multipart()[0] != STOP:
        pass


def step_chunks(chunks: int, size: int) -> list[memoryview]:
    block = memoryview(bytes(chunks * size))
    return [block[i * size : (i + 1) * size] for i in range(chunks)]


def per_chunk(push: zmq.Socket, views: list[memoryview]) -> None:
    for i, view in enumerate(views):
        push.send_multipart(ipc.encode(ipc.Audio(f"r{i}", 7, view)), copy=False)


def batched(push: zmq.Socket, views: list[memoryview]) -> None:
    outbox = ipc.AudioOutbox()
    for i, view in enumerate(views):
        outbox.add(f"r{i}", 7, view)
    push.send_multipart(ipc.encode(outbox.take()), copy=False)


def cpu_us_per_step(send: Callable[[zmq.Socket, list[memoryview]], None], push: zmq.Socket, args: argparse.Namespace,
                    repeats: int = 5) -> float:
    """The median over `repeats` passes of the main thread's CPU time per step (building the step's views included)."""
    passes = []
    for _ in range(repeats):
        start = time.thread_time()
        for _ in range(args.steps):
            send(push, step_chunks(args.chunks, args.chunk_bytes))
        passes.append((time.thread_time() - start) / args.steps * 1e6)
    return sorted(passes)[len(passes) // 2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=26)
    p.add_argument("--chunk-bytes", type=int, default=40_000)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    keep_freed_buffers()  # as in a replica (its EngineWorker sets it)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    address = f"ipc:///tmp/vox-audio-ipc-{time.time_ns()}"
    push.bind(address)
    reader = mp.get_context("spawn").Process(target=drain, args=(address,))
    reader.start()
    rows = {"chunks": args.chunks, "chunk_bytes": args.chunk_bytes,
            "per_chunk_us": round(cpu_us_per_step(per_chunk, push, args), 1),
            "batched_us": round(cpu_us_per_step(batched, push, args), 1)}
    push.send_multipart([STOP])
    reader.join()
    print(f"{args.chunks} chunks of {args.chunk_bytes} bytes per step: one message per chunk "
          f"{rows['per_chunk_us']} us, one AudioBatch {rows['batched_us']} us of the loop's CPU per step")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

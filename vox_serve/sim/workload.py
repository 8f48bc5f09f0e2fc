"""Workloads for the simulated engine: who arrives when, with how long a prompt and an answer."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Arrival:
    t: float  # send time, seconds
    req_id: str
    prompt_len: int  # prompt tokens
    num_frames: int  # audio frames the model generates before its stop
    streaming: bool = True
    ignore_eos: bool = False
    max_tokens: int | None = None  # None: room for every frame
    # Incremental input streaming (a model with a streamed text column): (send time, text ids) pieces
    # and when the text ends; None: the whole text is in the prompt.
    text_pieces: tuple[tuple[float, int], ...] = ()
    text_end: float | None = None


@dataclass(frozen=True)
class WorkloadSpec:
    """Poisson arrivals at `rate` requests/s; answer lengths uniform in `audio_seconds`."""

    rate: float
    num_requests: int
    audio_seconds: tuple[float, float] = (3.0, 8.0)
    prompt_tokens: tuple[int, int] = (20, 80)
    streaming_fraction: float = 1.0
    seed: int = 0


def poisson_workload(spec: WorkloadSpec, frame_seconds: float) -> list[Arrival]:
    """`rate <= 0` or infinite sends every request at t = 0 (a batch job)."""
    rng = random.Random(spec.seed)
    t, out = 0.0, []
    for i in range(spec.num_requests):
        if 0 < spec.rate < float("inf"):
            t += rng.expovariate(spec.rate)
        seconds = rng.uniform(*spec.audio_seconds)
        out.append(Arrival(
            t=t, req_id=f"r{i:05d}", prompt_len=rng.randint(*spec.prompt_tokens),
            num_frames=max(1, round(seconds / frame_seconds)),
            streaming=rng.random() < spec.streaming_fraction,
        ))
    return out

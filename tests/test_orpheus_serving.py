"""Serving mechanics on the real tiny program: chunked prefill and KV preemption change nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from orpheus_helpers import make_program, run_requests

from tests.engine_helpers import engine_worker
from vox_serve.engine_loop import EngineLoop
from vox_serve.scheduler.base import Scheduler

FIELDS = [{"text": "The first request has a fairly long sentence to say.", "max_tokens": 63, "ignore_eos": True},
          {"text": "And the second one, a bit shorter.", "voice": "zoe", "max_tokens": 63, "ignore_eos": True}]


def _tokens_and_audio(reqs: list) -> list:
    return [(r.tokens, np.frombuffer(b"".join(r.extra["chunks"]), dtype="<i2").astype(np.int32)) for r in reqs]


def assert_same(a: list, b: list) -> None:
    """Tokens identical; audio identical up to 1 int16 step: the codec batches differ between runs
    (other chunks share a launch), and CPU convolutions round differently at other batch sizes."""
    for (tokens_a, audio_a), (tokens_b, audio_b) in zip(a, b, strict=True):
        assert tokens_a == tokens_b
        assert audio_a.shape == audio_b.shape and audio_a.size > 0
        assert np.abs(audio_a - audio_b).max() <= 1


def test_chunked_prefill_equals_one_shot(tiny_orpheus_dir: Path) -> None:
    program, config = make_program(tiny_orpheus_dir)
    whole = _tokens_and_audio(run_requests(program, config, FIELDS))
    program, config = make_program(tiny_orpheus_dir, max_prefill_tokens=16)  # prompts are ~40 tokens
    chunked = _tokens_and_audio(run_requests(program, config, FIELDS))
    assert_same(chunked, whole)


def test_preemption_under_kv_pressure_equals_unconstrained(tiny_orpheus_dir: Path) -> None:
    """Each request needs 7 pages; with 10 pages one is preempted, recomputes, and ends identically."""
    program, config = make_program(tiny_orpheus_dir)
    roomy = _tokens_and_audio(run_requests(program, config, FIELDS))
    program, config = make_program(tiny_orpheus_dir, max_num_pages=10)
    scheduler = Scheduler(program.meta, program.limits, config.scheduler)
    preemptions = []
    original = scheduler._preempt
    scheduler._preempt = lambda req: (preemptions.append(req.req_id), original(req))
    loop = EngineLoop(scheduler, engine_worker(program), record=True)
    tight = _tokens_and_audio(run_requests(program, config, FIELDS, loop))
    assert preemptions, "the pool was large enough: the test did not exercise preemption"
    assert_same(tight, roomy)
    assert scheduler.pool.num_free == scheduler.pool.num_usable
    scheduler.pool.check()

"""--async-scheduling: step k+1 is planned and launched before step k's results are back.

Decode rows then carry a placeholder input that the worker fills on the device from step k's
samples (with its repetition-penalty history and audio-code count); a request that stops is
retired one step late and nothing is emitted past its stop. Greedy output equals synchronous
scheduling's, token for token and byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.orpheus_helpers import make_program
from tests.sim_helpers import Bench
from vox_serve.core.plan import StepPlan
from vox_serve.core.request import RequestStatus
from vox_serve.engine_loop import EngineLoop
from vox_serve.request_builder import build_request
from vox_serve.scheduler.base import Scheduler
from vox_serve.worker.program_worker import ProgramWorker

FIELDS = [
    {"text": "Hello there, this is a test.", "max_tokens": 40},
    {"text": "Another, longer sentence for the batch.", "voice": "leo", "max_tokens": 29},
    {"text": "A late arrival.", "max_tokens": 33, "repetition_penalty": 1.0},
]


def _run(program, config, async_scheduling: bool) -> list:  # noqa: ANN001
    loop = EngineLoop(Scheduler(program.meta, program.limits, config.scheduler), ProgramWorker(program),
                      async_scheduling=async_scheduling)
    reqs = []
    for i, fields in enumerate(FIELDS):
        req = build_request(program.meta, program.preprocess, fields, f"r{i}", greedy=True, seed=i)
        req.extra["chunks"] = []
        req.sink = lambda r, pcm, final: pcm and r.extra["chunks"].append(pcm)
        reqs.append(req)
    for req in reqs[:2]:
        loop.scheduler.add_request(req)
    for _ in range(5):
        loop.step()
    loop.scheduler.add_request(reqs[2])  # joins while the others decode (prefill beside pending decodes)
    loop.run_until_idle()
    assert all(r.error is None for r in reqs)
    return reqs


@pytest.mark.slow
def test_async_greedy_output_equals_sync(tiny_orpheus_dir: Path) -> None:
    program, config = make_program(tiny_orpheus_dir, frames_per_chunk=2)
    sync = _run(program, config, async_scheduling=False)
    program, config = make_program(tiny_orpheus_dir, frames_per_chunk=2)
    asynchronous = _run(program, config, async_scheduling=True)
    for a, b in zip(sync, asynchronous, strict=True):
        assert a.tokens == b.tokens and len(a.tokens) == a.sampling.max_tokens
        assert a.extra["chunks"] == b.extra["chunks"] and a.extra["chunks"]


def test_a_pending_input_must_come_from_the_previous_step(tiny_orpheus_dir: Path) -> None:
    program, config = make_program(tiny_orpheus_dir)
    scheduler = Scheduler(program.meta, program.limits, config.scheduler)
    worker = ProgramWorker(program)
    req = build_request(program.meta, program.preprocess, {"text": "Hi."}, "r0", greedy=True)
    scheduler.add_request(req)
    worker.collect(worker.launch(scheduler.schedule()))  # prefill r0: the next row will be pending
    empty = StepPlan(99)
    worker.collect(worker.launch(empty))  # a step that sampled nothing
    with pytest.raises(ValueError, match="not sampled by the previous step"):
        worker.launch(scheduler.schedule())


def test_a_stop_seen_one_step_late_discards_the_planned_row_and_frees_pages_after_it_lands() -> None:
    b = Bench("base")
    req = b.add("r0", frames=1)  # tokens 0 and 1 are audio, token 2 is its stop
    s, w = b.scheduler, b.worker
    p1 = s.schedule()
    h1 = w.launch(p1)  # prefill: samples token 0
    p2 = s.schedule()  # planned before token 0 is known
    assert p2.decode[0].pending_input and p2.decode[0].gen_index == 1
    h2 = w.launch(p2)
    s.update(p1, w.collect(h1))
    p3 = s.schedule()
    h3 = w.launch(p3)  # samples token 2: the stop
    s.update(p2, w.collect(h2))
    p4 = s.schedule()  # planned past the stop, which is not back yet
    assert p4.decode and p4.decode[0].gen_index == 3
    h4 = w.launch(p4)
    s.update(p3, w.collect(h3))
    assert req.status is RequestStatus.FINISHED and len(req.tokens) == 2  # one frame: no audio to drain
    assert s.pool.owners() == ["r0"], "step 4 still writes r0's pages"
    s.update(p4, w.collect(h4))
    assert len(req.tokens) == 2 and s.pool.num_free == s.pool.num_usable and not s.requests

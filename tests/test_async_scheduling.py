"""--async-scheduling: step k+1 is planned and launched before step k's results are back.

A request decoding in both steps takes its input for k+1 from its slot's token history on the
device, where step k writes it (with its repetition-penalty window and audio-code count); a request
that stops is retired one step late and nothing is emitted past its stop. Greedy output equals synchronous
scheduling's, token for token and byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine_helpers import make_loop
from tests.orpheus_helpers import make_program
from tests.sim_helpers import Bench
from vox_serve.core.request import RequestStatus
from vox_serve.request_builder import build_request

FIELDS = [
    {"text": "Hello there, this is a test.", "max_tokens": 40},
    {"text": "Another, longer sentence for the batch.", "voice": "leo", "max_tokens": 29},
    {"text": "A late arrival.", "max_tokens": 33, "repetition_penalty": 1.0},
]


def _run(program, config, async_scheduling: bool) -> list:  # noqa: ANN001
    loop = make_loop(program, config, async_scheduling=async_scheduling)
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
        assert a.tokens == b.tokens and a.num_generated == a.sampling.max_tokens
        assert a.extra["chunks"] == b.extra["chunks"] and a.extra["chunks"]


def test_a_stop_seen_one_step_late_discards_the_planned_row_and_frees_pages_after_it_lands() -> None:
    b = Bench("base")
    req = b.add("r0", frames=1)  # tokens 0 and 1 are audio, token 2 is its stop
    s, w = b.scheduler, b.worker
    p1 = s.schedule()
    h1 = w.launch(p1)  # prefill: samples token 0
    p2 = s.schedule()  # planned before token 0 is known: its input is read from the history on the device
    [row] = p2.decode
    assert row.start == req.prompt_len and s.table.num_pending[req.slot] == 2
    h2 = w.launch(p2)
    s.update(p1, w.collect(h1))
    p3 = s.schedule()
    h3 = w.launch(p3)  # samples token 2: the stop
    s.update(p2, w.collect(h2))
    p4 = s.schedule()  # planned past the stop, which is not back yet
    assert [r.start for r in p4.decode] == [req.prompt_len + 2]
    h4 = w.launch(p4)
    s.update(p3, w.collect(h3))
    assert req.status is RequestStatus.FINISHED and req.num_generated == 2  # one frame: no audio to drain
    assert s.pool.owners() == ["r0"], "step 4 still writes r0's pages"
    s.update(p4, w.collect(h4))
    assert req.num_generated == 2 and s.pool.num_free == s.pool.num_usable and not s.requests

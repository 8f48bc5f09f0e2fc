"""Requests whose text streams in (a model that feeds one text id per frame), on the simulated engine:
while its text has run dry a request waits, keeps its KV pages and slot, still gets its ready
audio decoded, and holds up no one; it resumes when text arrives and finishes after the end."""

from __future__ import annotations

import dataclasses

import pytest

from tests.sim_helpers import META, Bench, finished, limits
from vox_serve.core.request import Request, RequestStatus, TextFeed
from vox_serve.engine_loop import TEXT_WAIT_S, EngineLoop
from vox_serve.sim.worker import TEXT_END_ID, TEXT_ID_BASE

TEXT_META = dataclasses.replace(META, input_columns=2, streamed_text_column=1, stateful_codec=True)
POLICIES = ("base", "online", "offline", "deadline")


def bench(policy: str, **config: object) -> Bench:
    return Bench(policy, TEXT_META, dataclasses.replace(limits(), num_slots=4), **config)


def add_streaming(b: Bench, req_id: str, num_ids: int, frames: int = 30) -> Request:
    """A request with its first `num_ids` of 20 text ids (the simulated worker checks the id of every
    generated token: the toy model's decode rows are half frames)."""
    req = b.add(req_id, frames=frames, max_tokens=200)
    req.text_feed = TextFeed(list(range(TEXT_ID_BASE, TEXT_ID_BASE + num_ids)))
    b.worker.set_text(req_id, 20)
    return req


def more_text(b: Bench, req: Request, num_ids: int, ended: bool = False) -> None:
    first = TEXT_ID_BASE + len(req.text_feed.ids)
    ids = list(range(first, first + num_ids)) + ([TEXT_END_ID] if ended else [])
    b.scheduler.append_text(req.req_id, ids, ended)


def run_until(b: Bench, done, max_steps: int = 2000) -> None:  # noqa: ANN001
    b.run(max_steps, until=done)


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_out_of_text_waits_with_its_pages_and_slot_and_others_run(policy: str,
                                                                             async_scheduling: bool) -> None:
    b = bench(policy, async_scheduling=async_scheduling)
    dry = add_streaming(b, "dry", num_ids=11)
    other = b.add("other", frames=20)
    run_until(b, lambda: finished(other))  # the other request is not held up
    assert dry.status is RequestStatus.RUNNING and dry.num_generated == 12  # the prompt's token, then one per id
    assert b.scheduler.pool.pages("dry") and b.scheduler.table.pool.slot("dry") is not None
    assert b.chunks["dry"], "frames generated before the text ran dry are decoded to audio"
    assert b.scheduler.num_waiting_for_text == 1
    for _ in range(5):
        plan = b.step()
        assert not plan.prefill and not plan.decode
    more_text(b, dry, 9, ended=True)
    run_until(b, lambda: finished(dry))
    assert dry.num_generated == 60  # its stop (the worker's script: 30 frames), well after the end of its text
    assert b.scheduler.pool.num_free == b.scheduler.pool.num_usable
    assert b.scheduler.table.num_free == b.scheduler.table.num_slots


def test_aborting_a_request_that_waits_for_text_frees_everything() -> None:
    b = bench("base")
    dry = add_streaming(b, "dry", num_ids=8)
    run_until(b, lambda: b.scheduler.num_waiting_for_text == 1 and b.scheduler.table.pool.slot("dry") is not None)
    assert b.scheduler.abort("dry", "timed out")
    assert dry.status is RequestStatus.ABORTED and not b.scheduler.has_work()
    assert b.scheduler.pool.num_free == b.scheduler.pool.num_usable
    assert b.scheduler.table.num_free == b.scheduler.table.num_slots


def test_the_engine_loop_waits_for_text_instead_of_failing_a_request_that_cannot_be_admitted() -> None:
    """A request that waits for pages held by a request waiting for text is not "stalled": text (a
    message) can arrive and free them."""
    b = Bench("base", TEXT_META, limits(num_pages=8))
    add_streaming(b, "dry", num_ids=2)
    loop = EngineLoop(b.scheduler, b.worker)
    while b.scheduler.num_waiting_for_text == 0:
        loop.poll()
    b.add("late", frames=5, prompt_len=28)  # needs more pages than are left
    assert [loop.poll() for _ in range(5)] == [TEXT_WAIT_S] * 5
    assert [r.req_id for r in b.scheduler.waiting] == ["late"]


@pytest.mark.parametrize("policy", POLICIES)
def test_requests_waiting_for_text_leave_their_batch_places_to_others(policy: str) -> None:
    """Issue 10, defect 2: with a decode batch of 2, two requests whose text has run dry held every
    batch place, and an ordinary request waited until they timed out."""
    b = Bench(policy, TEXT_META, dataclasses.replace(limits(max_batch=2), num_slots=4))
    dry = [add_streaming(b, f"dry-{i}", num_ids=3) for i in range(2)]
    run_until(b, lambda: b.scheduler.num_waiting_for_text == 2)
    assert all(r.status is RequestStatus.RUNNING for r in dry)
    other = b.add("other", frames=6)
    run_until(b, lambda: finished(other), max_steps=300)
    assert all(r.status is RequestStatus.RUNNING and b.scheduler.pool.pages(r.req_id) for r in dry)

"""Each policy rule of the spec on small scripted scenarios, on the simulated engine's virtual clock.

Toy geometry (tests/sim_helpers.py): a frame is 2 tokens and 0.1 s of audio, a chunk 2 frames
(0.2 s); chunk c is ready once 2c + 4 frames exist. A decode step takes ~11 ms.
"""

from __future__ import annotations

import pytest

from tests.sim_helpers import SR, Bench, finished, limits
from vox_serve.config import SchedulerConfig
from vox_serve.core.request import RequestStatus
from vox_serve.scheduler.base import Scheduler
from vox_serve.scheduler.deadline import DeadlineScheduler
from vox_serve.scheduler.factory import make_scheduler
from vox_serve.scheduler.online import OnlineScheduler
from vox_serve.scheduler.playback import PLAYBACK_MARGIN_S

# ---- base -----------------------------------------------------------------------------------


def test_base_prefills_new_requests_first_and_decodes_every_running_one() -> None:
    b = Bench("base")
    b.add("r0", frames=20)
    assert [r.req_id for r in b.step().prefill] == ["r0"]
    b.add("r1", frames=20)
    plan = b.step()
    assert [r.req_id for r in plan.prefill] == ["r1"] and [r.req_id for r in plan.decode] == ["r0"]
    assert sorted(r.req_id for r in b.step().decode) == ["r0", "r1"]


def test_base_decodes_a_chunk_in_the_first_step_after_it_is_ready() -> None:
    b = Bench("base")
    req = b.add("r0", frames=20)
    while req.num_codes < 4 * 2:  # chunk 0 needs 4 frames
        assert not b.step().codec
    assert [(r.req_id, r.chunk_index) for r in b.step().codec] == [("r0", 0)]


def test_input_streaming_is_a_name_of_base() -> None:
    b = Bench("input_streaming")
    assert type(b.scheduler) is Scheduler
    with pytest.raises(ValueError, match="unknown scheduler type"):
        make_scheduler(b.scheduler.meta, b.limits, SchedulerConfig(scheduler_type="fastest"))


# ---- online ---------------------------------------------------------------------------------


def _pressing_at(chunks: list[tuple[float, int]], now: float) -> bool:
    """The spec's rule, from what the client received: pressing before the first chunk, and from a
    second before the client starts playing the last chunk it has received."""
    if not chunks:
        return True
    first = chunks[0][0]
    before_last = sum(n for _, n in chunks[:-1]) / SR
    return now >= first + before_last - PLAYBACK_MARGIN_S


def test_online_decodes_a_stream_just_in_time_and_holds_audio_otherwise() -> None:
    b = Bench("online")
    req = b.add("r0", frames=150)  # 15 s of audio, generated ~4x faster than real time
    held = 0
    while b.scheduler.has_work():
        now = b.clock()
        received = list(b.chunks["r0"])
        ready = b.scheduler.has_ready_chunk(req)
        plan = b.step()
        if plan.is_empty:
            b.clock.advance_to(b.scheduler.next_wakeup())
            continue
        decoded = any(r.req_id == "r0" for r in plan.codec)
        assert decoded == (ready and _pressing_at(received, now)), f"at {now:.3f}"
        held += ready and not decoded
    assert held > 50
    assert finished(req)
    arrivals = b.chunks["r0"]
    for i in range(1, len(arrivals)):  # every chunk on time; each batch sent about a second ahead
        buffered = sum(n for _, n in arrivals[:i]) / SR - (arrivals[i][0] - arrivals[0][0])
        assert buffered > 0
        if arrivals[i][0] > arrivals[i - 1][0]:
            assert buffered <= PLAYBACK_MARGIN_S + 0.2 + 0.05


def test_online_other_ready_chunks_join_a_pressing_batch_while_it_has_room() -> None:
    b = Bench("online", lim=limits(max_codec_batch=3))
    batch = b.add("batch", frames=150, streaming=False)  # not pressing while it generates tokens
    while batch.next_chunk + 3 > batch.num_codes // 2 // 2:
        assert not b.step().codec, "decoded audio without a pressing chunk"
    new = b.add("new", frames=20)
    while not b.scheduler.has_ready_chunk(new):
        assert not b.step().codec
    plan = b.step()
    assert [r.req_id for r in plan.codec] == ["new", "batch", "batch"]  # pressing first, then while room
    assert [r.chunk_index for r in plan.codec] == [0, 0, 1]
    assert b.scheduler.reasons["codec"] == {"new": "pressing", "batch": "joins a pressing batch"}


def test_online_non_streaming_request_is_pressing_once_its_tokens_are_all_generated() -> None:
    b = Bench("online")
    req = b.add("batch", frames=30, streaming=False)
    while req.status is RequestStatus.RUNNING or req.status is RequestStatus.WAITING:
        assert not b.step().codec
    assert b.scheduler.is_pressing(req)
    b.run()
    assert finished(req) and len(b.chunks["batch"]) == 14


def test_online_pressing_requests_decode_first() -> None:
    b = Bench("online")
    reqs = [b.add(f"r{i}", frames=40, streaming=i != 1) for i in range(3)]
    for _ in range(3):
        b.step()
    b.scheduler.now = b.clock()
    order = b.scheduler.decode_order(list(b.scheduler.running))
    assert [r.req_id for r in order] == ["r0", "r2", "r1"]  # r1 is non-streaming and still generating
    assert not b.scheduler.is_pressing(reqs[1])


def test_online_next_wakeup_is_when_the_held_chunk_becomes_pressing() -> None:
    b = Bench("online")
    req = b.add("r0", frames=60)
    while not (b.scheduler.has_ready_chunk(req) and req.status is RequestStatus.DRAINING):
        b.step()
    assert b.step().is_empty
    first = b.chunks["r0"][0][0]
    before_last = sum(n for _, n in b.chunks["r0"][:-1]) / SR
    assert b.scheduler.next_wakeup() == pytest.approx(first + before_last - PLAYBACK_MARGIN_S)


def test_the_client_clock_starts_when_the_first_chunk_arrives() -> None:
    b = Bench("online")
    req = b.add("r0", frames=10)
    b.clock.advance(5.0)  # the request waited in the queue: playback does not start before its audio
    b.run()
    assert req.stats.first_audio == b.chunks["r0"][0][0]
    assert b.chunks["r0"][0][0] > 5.0


# ---- offline --------------------------------------------------------------------------------


def test_offline_decodes_audio_only_while_no_admitted_request_generates_tokens() -> None:
    b = Bench("offline")
    short, long = b.add("short", frames=10), b.add("long", frames=60)
    tokens_done = None
    while b.scheduler.has_work():
        running = bool(b.scheduler.running)
        plan = b.step()
        assert not (plan.codec and running)
        if tokens_done is None and long.status is not RequestStatus.RUNNING:
            tokens_done = b.clock()
    assert finished(short) and finished(long)
    assert b.chunks["short"][0][0] >= tokens_done  # short's audio waited for long's tokens
    assert len(b.chunks["short"]) == 4 and len(b.chunks["long"]) == 29


# ---- deadline -------------------------------------------------------------------------------


def _deadline(**config: float) -> Bench:
    defaults = dict(deadline_startup_ms=300.0, deadline_max_prefill_deferral_ms=200.0, deadline_lm_step_ms=11.0,
                    deadline_codec_ms=2.0, deadline_prefill_ms=15.0)
    return Bench("deadline", **{**defaults, **config})


def test_deadline_decodes_chunks_in_playback_deadline_order() -> None:
    b2 = Bench("deadline", lim=limits(max_codec_batch=1), deadline_startup_ms=300.0)
    late, early = b2.add("late", frames=20), b2.add("early", frames=20)
    late.stats.arrival, early.stats.arrival = 1.0, 0.5  # first audio due at 1.3 s and 0.8 s
    order = []
    while len(order) < 2:
        order += [r.req_id for r in b2.step().codec]
    assert order == ["early", "late"]


def test_deadline_admits_new_requests_by_first_audio_deadline() -> None:
    b = Bench("deadline", lim=limits(max_batch=1), deadline_startup_ms=300.0)
    b.add("batch", frames=10, streaming=False)
    b.add("stream", frames=10)
    assert [r.req_id for r in b.scheduler.admission_order()] == ["stream", "batch"]
    assert [r.req_id for r in b.step().prefill] == ["stream"]


def _stream_about_to_underrun(b: Bench, streaming: bool = True):  # noqa: ANN202
    req = b.add("old", frames=200, streaming=streaming)
    while not b.chunks["old"] if streaming else req.num_codes < 40:
        b.step()
    if streaming:  # the client has played almost all it received
        b.clock.advance_to(req.stats.first_audio + req.stats.num_audio_samples / SR - 0.005)
    return req


def test_deadline_defers_prefills_while_a_stream_is_about_to_underrun_for_at_most_the_limit() -> None:
    b = _deadline()
    old = _stream_about_to_underrun(b)
    b.add("new", frames=10)
    plan = b.step()
    assert not plan.prefill and [r.req_id for r in plan.decode] == ["old"]
    assert any("deferred" in n for n in b.scheduler.notes)
    b.scheduler.now = b.clock()
    assert b.scheduler.slack(old) < 0.015
    b.clock.advance(0.1)  # still about to underrun (later still), deferred for less than 200 ms
    assert not b.step().prefill
    b.clock.advance(0.1)
    plan = b.step()
    assert [r.req_id for r in plan.prefill] == ["new"]
    assert any("admitted after" in n for n in b.scheduler.notes)


def test_deadline_ends_a_deferral_early_when_the_waiting_streams_own_first_audio_is_due() -> None:
    b = _deadline(deadline_max_prefill_deferral_ms=10_000.0)  # the limit never ends this deferral
    s = b.scheduler
    assert isinstance(s, DeadlineScheduler)
    _stream_about_to_underrun(b)
    new = b.add("new", frames=10)
    assert not b.step().prefill  # deferred: its first audio is due in 300 ms, it has time
    s.now = b.clock()
    due_at = s.now + s.first_audio_slack(new) - s.prefill_s  # waiting longer would miss its first audio
    assert due_at > s.now + 0.05
    assert s.next_wakeup() is not None and s.next_wakeup() <= due_at + 1e-9
    b.clock.advance_to(due_at - 0.02)
    assert not b.step().prefill
    b.clock.advance_to(due_at + 0.001)
    plan = b.step()
    assert [r.req_id for r in plan.prefill] == ["new"]
    assert s._at_risk and any("its own first audio is due" in n for n in s.notes)
    b.run()
    assert finished(new) and new.stats.first_audio - new.stats.arrival <= 0.3 + 0.02


def test_deadline_estimates_use_the_measured_step_period_once_there_is_one() -> None:
    b = _deadline(deadline_lm_step_ms=50.0)  # configured far above the toy's ~11 ms steps
    s = b.scheduler
    assert isinstance(s, DeadlineScheduler)
    req = b.add("r0", frames=200)
    times = []
    for _ in range(4):
        b.step()
        times.append(b.clock())
    assert s.step_period() == pytest.approx(0.050)  # too few steps measured: the configured estimate
    for _ in range(120):
        b.step()
        times.append(b.clock())
    gaps = [t1 - t0 for t0, t1 in zip(times[-10:-1], times[-9:], strict=True)]
    assert s.step_period() == pytest.approx(sum(gaps) / len(gaps), rel=0.1)
    s.now = b.clock()
    if not s.has_ready_chunk(req):
        assert s.time_to_next_chunk(req) < 8 * 0.011 + s.codec_s
    b.clock.advance(1.0)  # a stall is not a step: the measured period ignores it
    b.step()
    assert s.step_period() == pytest.approx(sum(gaps) / len(gaps), rel=0.1)


def test_deadline_runs_more_than_a_batch_only_while_the_batch_keeps_every_stream_real_time() -> None:
    b = Bench("deadline", lim=limits(max_batch=2), deadline_prefill_ms=0.0, deadline_startup_ms=300.0)
    s = b.scheduler
    assert isinstance(s, DeadlineScheduler)
    ahead = [b.add(f"ahead{i}", frames=150) for i in range(2)]
    while min(r.stats.num_audio_samples for r in ahead) < 1000:
        b.step()
    # A toy frame is 0.1 s of audio and 2 steps: at a 60 ms period, one batch slot keeps 0.1 / 0.06 / 2
    # streams real time, so a batch of 2 keeps 1.7 -- not a third.
    s._period_s = 0.060
    b.add("new", frames=20)
    assert s.realtime_capacity() == pytest.approx(2 * 0.1 / 0.060 / 2)
    plan = b.step()
    assert not plan.prefill and len(s.running) == 2
    s._period_s = 0.011  # 9 streams: room for a third
    plan = b.step()
    assert [r.req_id for r in plan.prefill] == ["new"] and len(s.running) == 3


def test_deadline_lends_no_batch_slot_while_a_stream_is_about_to_underrun() -> None:
    # Deferrals end at once (limit 0): only the full batch keeps "new" waiting.
    b = Bench("deadline", lim=limits(max_batch=1), deadline_startup_ms=300.0, deadline_max_prefill_deferral_ms=0.0,
              deadline_lm_step_ms=11.0, deadline_codec_ms=2.0, deadline_prefill_ms=15.0)
    old = _stream_about_to_underrun(b)
    b.add("new", frames=10)
    plan = b.step()
    assert not plan.prefill and len(b.scheduler.running) == 1 and b.scheduler._at_risk == [old]


def test_deadline_non_streaming_requests_never_defer_prefills() -> None:
    b = _deadline()
    _stream_about_to_underrun(b, streaming=False)
    b.add("new", frames=10)
    assert [r.req_id for r in b.step().prefill] == ["new"]


def test_deadline_runs_more_requests_than_a_batch_and_gives_the_batch_to_the_earliest_deadlines() -> None:
    b = Bench("deadline", lim=limits(max_batch=2), deadline_prefill_ms=0.0, deadline_startup_ms=300.0)
    ahead = [b.add(f"ahead{i}", frames=150) for i in range(2)]
    while min(r.stats.num_audio_samples for r in ahead) < 1000:  # both a second ahead of their clients
        b.step()
    new = b.add("new", frames=20)
    plan = b.step()
    assert [r.req_id for r in plan.prefill] == ["new"] and len(b.scheduler.running) == 3
    plan = b.step()
    assert "new" in [r.req_id for r in plan.decode] and len(plan.decode) == 2
    assert b.scheduler.reasons["decode"]["new"] == "earliest deadline"
    b.run()
    assert all(finished(r) for r in [*ahead, new])


def test_deadline_non_streaming_requests_use_the_capacity_streams_leave_but_never_starve() -> None:
    b = Bench("deadline", lim=limits(max_batch=2), deadline_prefill_ms=0.0, deadline_startup_ms=300.0,
              deadline_max_prefill_deferral_ms=100.0)
    batch = b.add("batch", frames=30, streaming=False)
    streams = [b.add(f"s{i}", frames=150) for i in range(2)]
    b.step()
    gaps, last = [], None
    while batch.status is not RequestStatus.FINISHED:
        plan = b.step()
        if any(r.req_id == "batch" for r in plan.decode):
            if last is not None:
                gaps.append(b.scheduler.now - last)
            last = b.scheduler.now
        if plan.is_empty:
            b.clock.advance_to(b.scheduler.next_wakeup())
    assert max(gaps) < 0.1 + 0.05  # decoded at least every max deferral (+ a step)
    assert len(gaps) > 10
    b.run()
    assert all(finished(r) for r in streams)


def test_deadline_estimates_come_from_the_configured_costs() -> None:
    b = _deadline(deadline_lm_step_ms=20.0, deadline_codec_ms=5.0)
    s = b.scheduler
    assert isinstance(s, DeadlineScheduler)
    req = b.add("r0", frames=20)
    b.step()  # prefilled: 1 token so far, chunk 0 needs 8
    s.now = b.clock()
    assert s.time_to_next_chunk(req) == pytest.approx(7 * 0.020 + 0.005)
    assert s.slack(req) == pytest.approx(req.stats.arrival + 0.3 - s.now - 7 * 0.020 - 0.005)


def test_policies_are_subclasses_with_the_same_life_cycle() -> None:
    for name, cls in (("online", OnlineScheduler), ("deadline", DeadlineScheduler)):
        b = Bench(name)
        assert isinstance(b.scheduler, cls) and isinstance(b.scheduler, Scheduler)
        req = b.add("r0", frames=12)
        b.run()
        assert finished(req)


@pytest.mark.parametrize("policy", ["base", "online", "offline", "deadline"])
def test_the_last_position_of_a_chunked_prompt_is_prefilled_not_decoded(policy: str) -> None:
    """A decode row's ids come from the generated history, so a prompt one token longer than the prefill
    budget computes its last prompt position (the host's ids, its prompt vectors) in a prefill row."""
    b = Bench(policy, lim=limits(max_prefill_tokens=8))
    req = b.add("r0", frames=4, prompt_len=9)
    first = b.step()
    assert first.prefill.num_tokens.tolist() == [8] and not len(first.decode)
    second = b.step()
    assert second.prefill.start.tolist() == [8] and second.prefill.num_tokens.tolist() == [1]
    assert not len(second.decode)
    b.run()
    assert req.status is RequestStatus.FINISHED and req.num_generated == 8  # the simulated 4 frames

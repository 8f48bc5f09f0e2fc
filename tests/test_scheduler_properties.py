"""Properties of every policy over random workloads on the simulated engine.

Every admitted request finishes with all of its audio (nothing starves, nothing is lost); KV
pages and codec slots never leak and the pools stay consistent after every step; chunks of a
request are decoded in order and exactly once; a stateful codec never gets two chunks of one
request in one batch. The simulated worker checks the per-plan contract (raising fails the step's
requests, which these tests would see); the hook below checks the pools after every step.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sim_helpers import META, PROFILE, expected_samples, limits
from vox_serve.core.request import RequestStatus
from vox_serve.sim.driver import Simulation, scheduler_config
from vox_serve.sim.workload import Arrival

POLICIES = ("base", "online", "offline", "deadline")

arrival = st.tuples(
    st.floats(0.0, 2.0),  # send time
    st.integers(1, 30),  # prompt tokens
    st.integers(1, 50),  # frames before the stop
    st.booleans(),  # streaming
    st.integers(0, 4),  # 0: stops by itself; else ignore_eos with max_tokens = 20 * k
)


def _arrivals(specs: list[tuple]) -> list[Arrival]:
    out = []
    for i, (t, prompt, frames, streaming, cap) in enumerate(specs):
        out.append(Arrival(t, f"q{i}", prompt, frames, streaming, ignore_eos=cap > 0,
                           max_tokens=20 * cap if cap else None))
    return out


def _check_pools(scheduler, worker) -> None:  # noqa: ANN001
    scheduler.pool.check()
    scheduler.table.pool.check()
    held = set(scheduler.pool.owners())
    alive = {r.req_id for r in scheduler.running} | scheduler.pages.held_back
    assert held <= alive, f"pages held by requests that are not running: {held - alive}"


def _run(policy: str, specs: list[tuple], async_scheduling: bool, stateful: bool, num_pages: int,
         max_batch: int, max_codec_batch: int):  # noqa: ANN202
    profile = PROFILE.with_meta(stateful_codec=True) if stateful else PROFILE
    lim = dataclasses.replace(limits(max_batch=max_batch, num_pages=num_pages, max_codec_batch=max_codec_batch),
                              num_slots=3 if stateful else 0)
    config = scheduler_config(policy, profile.costs, lim, async_scheduling=async_scheduling,
                              deadline_startup_ms=300.0, deadline_max_prefill_deferral_ms=200.0)
    sim = Simulation(profile, config, lim, _arrivals(specs), on_step=_check_pools, record=True)
    return sim, sim.run()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), specs=st.lists(arrival, min_size=1, max_size=10),
       async_scheduling=st.booleans(), stateful=st.booleans(), num_pages=st.integers(40, 120),
       max_batch=st.integers(1, 6), max_codec_batch=st.integers(1, 6))
def test_every_request_finishes_with_all_its_audio_and_nothing_leaks(
        policy: str, specs: list[tuple], async_scheduling: bool, stateful: bool, num_pages: int,
        max_batch: int, max_codec_batch: int) -> None:
    sim, run = _run(policy, specs, async_scheduling, stateful, num_pages, max_batch, max_codec_batch)
    for trace in run.traces:
        assert trace.error is None, (trace.req_id, trace.error)
        req = sim.requests[trace.req_id]
        assert req.status is RequestStatus.FINISHED
        num_frames = req.num_codes // META.codes_per_frame
        if not req.sampling.ignore_eos:
            assert num_frames == sim.worker.lengths[req.req_id]
        assert trace.num_samples == expected_samples(num_frames), "audio lost or duplicated"
        assert req.next_chunk == len(trace.chunks)
    scheduler = sim.scheduler
    assert not scheduler.requests and not scheduler.running and not scheduler.draining and not scheduler.waiting
    assert scheduler.pool.num_free == scheduler.pool.num_usable, "KV pages leaked"
    assert not scheduler.pages.held_back
    assert scheduler.table.num_free == scheduler.table.num_slots, "request slots leaked"


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(POLICIES), specs=st.lists(arrival, min_size=1, max_size=8))
def test_async_scheduling_emits_the_same_audio_as_sync(policy: str, specs: list[tuple]) -> None:
    """Same tokens, same chunks: a stop seen one step late emits nothing past it."""
    outputs = []
    for async_scheduling in (False, True):
        sim, run = _run(policy, specs, async_scheduling, False, 200, 4, 4)
        outputs.append({t.req_id: ([row for row in sim.requests[t.req_id].tokens],
                                   [n for _, n in t.chunks]) for t in run.traces})
    assert outputs[0] == outputs[1]


text_arrival = st.tuples(
    st.floats(0.0, 1.0),  # send time
    st.integers(1, 20),  # prompt tokens
    st.integers(1, 40),  # frames before the stop
    st.booleans(),  # streaming
    st.lists(st.tuples(st.floats(0.0, 2.0), st.integers(0, 6)), max_size=5),  # text pieces: (delay, ids)
    st.floats(0.0, 3.0),  # text end, after the send time
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), specs=st.lists(text_arrival, min_size=1, max_size=6),
       async_scheduling=st.booleans(), num_pages=st.integers(30, 100), max_batch=st.integers(1, 4))
def test_requests_whose_text_arrives_late_or_runs_dry_wait_and_all_finish(
        policy: str, specs: list[tuple], async_scheduling: bool, num_pages: int, max_batch: int) -> None:
    """Input-streaming requests of a model that feeds one text id per frame: the simulated worker checks
    that frame k got text id k, then the end-of-text id, then none (nothing ran before its text arrived);
    every request still finishes with all its audio, and the pools end full."""
    profile = PROFILE.with_meta(input_columns=2, streamed_text_column=1, stateful_codec=True)
    lim = dataclasses.replace(limits(max_batch=max_batch, num_pages=num_pages), num_slots=3)
    arrivals = []
    for i, (t, prompt, frames, streaming, pieces, end) in enumerate(specs):
        arrivals.append(Arrival(t, f"s{i}", prompt, frames, streaming,
                                text_pieces=tuple((t + d, n) for d, n in pieces),
                                text_end=t + max([end] + [d for d, _ in pieces])))
    config = scheduler_config(policy, profile.costs, lim, async_scheduling=async_scheduling,
                              deadline_startup_ms=300.0, deadline_max_prefill_deferral_ms=200.0)
    sim = Simulation(profile, config, lim, arrivals, on_step=_check_pools)
    run = sim.run()
    for trace in run.traces:
        assert trace.error is None, (trace.req_id, trace.error)
        req = sim.requests[trace.req_id]
        num_frames = req.num_codes // META.codes_per_frame
        assert num_frames == sim.worker.lengths[req.req_id]
        assert trace.num_samples == expected_samples(num_frames), "audio lost or duplicated"
    scheduler = sim.scheduler
    assert not scheduler.requests and scheduler.pool.num_free == scheduler.pool.num_usable
    assert scheduler.table.num_free == scheduler.table.num_slots

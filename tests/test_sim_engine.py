"""The simulated engine: cost curves, profiles, the virtual clock, the plan contract it enforces,
asynchronous overlap and calibration from a trace."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.sim_helpers import COSTS, META, PROFILE, Bench, expected_samples, limits
from vox_serve.core.meta import StopRule
from vox_serve.core.plan import CodecLaunch, StepPlan
from vox_serve.core.request import RequestStatus
from vox_serve.engine_loop import EngineLoop
from vox_serve.sim.calibrate import profile_from_trace
from vox_serve.sim.clock import VirtualClock
from vox_serve.sim.cost import Curve, Profile, load_profile
from vox_serve.sim.driver import EngineOptions, simulate
from vox_serve.sim.worker import PlanError, SimSlot, SimWorker
from vox_serve.sim.workload import Arrival, WorkloadSpec, poisson_workload
from vox_serve.trace import read_trace


def test_cost_curves_are_flat_below_interpolated_inside_and_extended_beyond() -> None:
    c = Curve.of([[8, 2.0], [1, 1.0], [16, 4.0]])
    assert c(0) == 1.0 and c(1) == 1.0
    assert c(4.5) == pytest.approx(1.5)
    assert c(12) == pytest.approx(3.0)
    assert c(32) == pytest.approx(8.0)


def test_the_default_orpheus_profile_documents_its_figures() -> None:
    p = load_profile("orpheus")
    assert p.meta.codes_per_frame == 7 and p.meta.samples_per_frame == 2048 and p.meta.sample_rate == 24000
    assert p.costs.decode_ms(1) == pytest.approx(2.65)
    assert 4.5 <= p.costs.decode_ms(128) + p.costs.decode_kv_ms_per_1k * 128 * 1.5 <= 7.6
    assert 14 <= p.costs.decode_ms(512) + p.costs.decode_kv_ms_per_1k * 512 * 1.5 <= 26
    assert p.raw["source"] and p.raw["notes"]
    with pytest.raises(FileNotFoundError, match="orpheus"):
        load_profile("no-such-model")


def test_virtual_clock_moves_only_forward() -> None:
    clock = VirtualClock()
    clock.advance(1.5)
    clock.advance_to(1.0)
    assert clock() == 1.5
    with pytest.raises(ValueError):
        clock.advance(-1)


def _codec(*rows: tuple[str, int, int]) -> CodecLaunch:
    """Chunks (req_id, chunk, slot) of the toy geometry: chunk c reads frames 2c .. 2c + 3."""
    n = len(rows)
    col = lambda values: np.asarray(values, dtype=np.int32)  # noqa: E731
    return CodecLaunch([r[0] for r in rows], col([r[2] for r in rows]), col([r[1] for r in rows]),
                       col([2 * r[1] for r in rows]), col([2 * r[1] + 4 for r in rows]), col([2] * n),
                       np.zeros(n, dtype=np.bool_))


def _worker(meta=PROFILE.meta, frames: int = 10) -> SimWorker:  # noqa: ANN001
    """A simulated worker whose slots 0 and 1 hold requests a and b with `frames` frames of codes."""
    w = SimWorker(meta, limits(), COSTS, VirtualClock())
    for slot, name in enumerate("ab"):
        w.slots[slot] = SimSlot(name, 4, 0, True, codes=[0] * (frames * meta.codes_per_frame))
    return w


def test_the_worker_rejects_chunks_out_of_order_twice_or_ahead_of_their_frames() -> None:
    w = _worker()
    w.execute(StepPlan(1, codec=_codec(("a", 0, 0), ("a", 1, 0))))
    with pytest.raises(PlanError, match="expected chunk 2"):
        w.execute(StepPlan(2, codec=_codec(("a", 1, 0))))
    with pytest.raises(PlanError, match="frames that do not exist"):
        w.execute(StepPlan(3, codec=_codec(("b", 0, 1), ("b", 1, 1), ("b", 2, 1), ("b", 3, 1), ("b", 4, 1))))
    with pytest.raises(PlanError, match="never admitted"):
        w.execute(StepPlan(4, codec=_codec(("c", 0, 5))))


def test_the_worker_rejects_two_chunks_of_one_request_in_a_stateful_codec_batch() -> None:
    w = _worker(dataclasses.replace(PROFILE.meta, stateful_codec=True))
    with pytest.raises(PlanError, match="two chunks of one request"):
        w.execute(StepPlan(1, codec=_codec(("a", 0, 0), ("a", 1, 0))))
    w.execute(StepPlan(2, codec=_codec(("a", 0, 0), ("b", 0, 1))))


def test_a_step_that_breaks_the_contract_fails_only_its_requests() -> None:
    b = Bench("base")
    good, bad = b.add("good", frames=10), b.add("bad", frames=10)
    loop = EngineLoop(b.scheduler, b.worker)
    loop.step()
    b.worker.slots[bad.slot].kv_len = 99  # the worker now expects "bad" elsewhere: its next row breaks the contract
    loop.step()
    assert bad.status is RequestStatus.FAILED and "starts at" in bad.error
    assert good.status is RequestStatus.FAILED  # it shared the failing step
    b.add("later", frames=5)
    loop.run_until_idle()
    assert not b.scheduler.requests


def test_outputs_stop_at_the_scripted_length_and_time_follows_the_cost_model() -> None:
    b = Bench("base")
    req = b.add("r0", frames=7)
    b.run()
    assert req.num_codes == 14 and req.finish_reason == "stop"
    s = b.worker.stats
    assert s.steps > 14 and s.device_seconds > 0
    assert b.clock() == pytest.approx(s.host_seconds + s.device_seconds)  # synchronous: host + device


@pytest.mark.parametrize("policy", ["base", "online", "offline", "deadline"])
def test_a_stop_frame_that_is_audio_is_kept_and_ends_the_request(policy: str) -> None:
    """OutKind.AUDIO_STOP (CSM's stop frame): its codes are kept and decoded, the request stops."""
    frame_steps = dataclasses.replace(META, codes_per_step=2)  # one sampled row is one whole frame
    outcomes = {}
    for keeps in (False, True):
        meta = dataclasses.replace(frame_steps, stop_rule=StopRule(token=0, keeps_frame=keeps))
        b = Bench(policy, meta=meta)
        req = b.add("r0", frames=7, max_tokens=20)
        b.run()
        assert req.finish_reason == "stop"
        outcomes[keeps] = (req.num_codes, sum(n for _, n in b.chunks["r0"]))
    assert outcomes[False] == (14, expected_samples(7))
    assert outcomes[True] == (16, expected_samples(8))


def test_asynchronous_scheduling_hides_host_time_behind_the_device() -> None:
    slow_host = dataclasses.replace(COSTS, host_ms_per_step=5.0)
    profile = Profile("slow-host", PROFILE.meta, slow_host, PROFILE.raw)
    arrivals = [Arrival(0.0, f"r{i}", 10, 40) for i in range(4)]
    runs = [simulate(profile, "base", arrivals, EngineOptions(max_batch=4, max_model_len=256),
                     async_scheduling=a) for a in (False, True)]
    assert runs[1].virtual_seconds < runs[0].virtual_seconds * 0.75
    assert [t.num_samples for t in runs[0].traces] == [t.num_samples for t in runs[1].traces]


def test_poisson_workload_is_repeatable_and_has_the_requested_rate() -> None:
    spec = WorkloadSpec(rate=10.0, num_requests=2000, seed=3)
    a, b = poisson_workload(spec, 0.1), poisson_workload(spec, 0.1)
    assert a == b
    assert a[-1].t == pytest.approx(200.0, rel=0.1)
    assert all(30 <= x.num_frames <= 80 for x in a)
    assert all(x.t == 0.0 for x in poisson_workload(WorkloadSpec(0.0, 5), 0.1))


def test_a_profile_calibrated_from_a_trace_reproduces_the_traced_stage_times(tmp_path) -> None:  # noqa: ANN001
    arrivals = [Arrival(0.01 * i, f"r{i}", 10 + i, 20) for i in range(6)]
    simulate(PROFILE, "base", arrivals, EngineOptions(max_batch=4, max_model_len=256), trace_dir=str(tmp_path))
    profile = profile_from_trace(read_trace(tmp_path), "toy-calibrated", "sim")
    assert profile["meta"]["name"] == "toy"
    for x, ms in profile["costs"]["decode_ms"]:
        assert ms == pytest.approx(COSTS.decode_ms(x), abs=1e-3)
    for x, ms in profile["costs"]["codec_ms"]:
        assert ms == pytest.approx(COSTS.codec_ms(x), abs=1e-3)
    loaded = Profile.from_dict(json.loads(json.dumps(profile)))
    assert loaded.costs.decode_ms(3) == pytest.approx(COSTS.decode_ms(3), abs=1e-3)


def test_the_zonos_profile_simulates_paired_rows() -> None:
    """The Zonos estimate profile: 44.1 kHz DAC frames, two KV streams a request, so the simulated
    scheduler holds twice the pages of a one-stream model for the same requests."""
    p = load_profile("zonos")
    assert p.meta.layout.kv_streams == 2 and p.meta.sample_rate == 44100 and p.meta.codec_pads_end
    assert "estimate" in p.raw["device"] and p.raw["notes"]
    options = EngineOptions(max_batch=4, max_model_len=256)
    assert options.limits(p.meta).kv_streams == 2
    assert options.limits(p.meta).num_pages - 1 == 2 * options.limits(PROFILE.meta).num_pages - 2
    arrivals = [Arrival(0.0, f"r{i}", 20, 40) for i in range(3)]  # prompts of 20, 40 frames each
    run = simulate(p, "base", arrivals, options)
    assert [t.num_samples for t in run.traces] == [40 * 512] * 3  # DAC pads the end: every frame is audio

"""The early hand-over of a step's PCM (Python runtime; the Rust runtime's is tested in its crate,
rust/src/serve/bench_tests.rs and rust/src/driver/disagg_tests.rs): the engine worker copies the PCM of a
step's codec rows back right after their launches, and the loop hands it to the requests before the step's
LM rows are collected, so each chunk goes out one LM step sooner. The audio and tokens are the same as with
the PCM handed over with the step (`VOX_EARLY_PCM=0`), synchronous or not; a lost early copy fails exactly the
requests of its rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine_helpers import make_loop
from tests.orpheus_helpers import make_program
from vox_serve.core.request import Request
from vox_serve.engine_loop import EngineLoop
from vox_serve.request_builder import build_request

FIELDS = [{"text": "Hello there, this is a test.", "max_tokens": 40},
          {"text": "Another, longer sentence.", "voice": "leo", "max_tokens": 29}]


def _logged(loop: EngineLoop, log: list[tuple[str, int | str]]) -> None:
    """Log each early hand-over and each collect of `loop`'s worker by step id."""
    worker = loop.worker
    early, collect = worker.early_pcm, worker.collect

    def logged_early(handle):  # noqa: ANN001, ANN202
        pcm = early(handle)
        if pcm is not None:
            log.append(("early", handle.plan.step_id))
        return pcm

    def logged_collect(handle):  # noqa: ANN001, ANN202
        log.append(("collect", handle.plan.step_id))
        return collect(handle)

    worker.early_pcm, worker.collect = logged_early, logged_collect


def _requests(program, sent: list[str], fields_list: list[dict] = FIELDS) -> list[Request]:  # noqa: ANN001
    """The requests, each chunk kept and its request's id added to `sent` (the chunks a poll makes)."""
    reqs = []
    for i, fields in enumerate(fields_list):
        req = build_request(program.meta, program.preprocess, fields, f"r{i}", greedy=True, seed=i)
        req.extra["chunks"] = []

        def sink(r: Request, pcm: bytes | None, final: bool) -> None:
            if pcm:
                r.extra["chunks"].append(bytes(pcm))
                sent.append(r.req_id)

        req.sink = sink
        reqs.append(req)
    return reqs


def _serve(loop: EngineLoop, log: list[tuple[str, int | str]], sent: list[str]) -> None:
    """Poll until idle; after each poll, its chunks go out (logged "audio"), as the scheduler process sends them."""
    while loop.poll() is not None:
        log.extend(("audio", req_id) for req_id in sent)
        sent.clear()


def _generate(ckpt: Path, monkeypatch: pytest.MonkeyPatch, early: bool, async_scheduling: bool,  # noqa: ANN202
              disaggregated: bool = False):
    monkeypatch.setenv("VOX_EARLY_PCM", "1" if early else "0")
    program, config = make_program(ckpt, frames_per_chunk=2)
    loop = make_loop(program, config, async_scheduling=async_scheduling, disaggregated=disaggregated)
    log: list[tuple[str, int | str]] = []
    sent: list[str] = []
    _logged(loop, log)
    reqs = _requests(program, sent)
    for req in reqs:
        loop.scheduler.add_request(req)
    _serve(loop, log, sent)
    assert all(r.error is None for r in reqs) and not loop.busy
    return reqs, log


@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling,disaggregated", [(False, False), (True, False), (False, True)],
                         ids=["sync", "async", "disaggregated"])
def test_pcm_handed_over_early_goes_out_before_its_step_is_collected_and_is_the_same(
        tiny_orpheus_dir: Path, monkeypatch: pytest.MonkeyPatch, async_scheduling: bool, disaggregated: bool) -> None:
    """The disaggregated worker (both halves on the CPU) hands over its codec half's PCM, collected first."""
    late, late_log = _generate(tiny_orpheus_dir, monkeypatch, False, async_scheduling, disaggregated)
    early, log = _generate(tiny_orpheus_dir, monkeypatch, True, async_scheduling, disaggregated)
    assert not any(what == "early" for what, _ in late_log)
    for a, b in zip(early, late, strict=True):
        assert a.tokens == b.tokens and a.num_generated == a.sampling.max_tokens
        assert a.extra["chunks"] == b.extra["chunks"] and a.extra["chunks"]
    # every chunk went out (its poll returned) after its step's early hand-over and before that step was collected
    audio = [i for i, (what, _) in enumerate(log) if what == "audio"]
    assert len(audio) == sum(len(r.extra["chunks"]) for r in early)
    for i in audio:
        step = next(s for what, s in reversed(log[:i]) if what == "early")
        assert ("collect", step) not in log[:i] and ("collect", step) in log[i:]


def test_a_lost_early_copy_fails_exactly_the_requests_of_its_rows(tiny_orpheus_dir: Path) -> None:
    program, config = make_program(tiny_orpheus_dir, frames_per_chunk=2)
    loop = make_loop(program, config)
    reqs = _requests(program, [], [{**FIELDS[0], "max_tokens": 70}, FIELDS[1]])  # r0 decodes its last chunks alone
    early = loop.worker.early_pcm
    lost: list[int] = []

    def losing(handle):  # noqa: ANN001, ANN202
        if len(handle.plan.codec) == 1 and "r0" in handle.plan.codec.req_ids and not lost:
            lost.append(handle.plan.step_id)
            raise RuntimeError("a made-up lost copy")
        return early(handle)

    loop.worker.early_pcm = losing
    for req in reqs:
        loop.scheduler.add_request(req)
    loop.run_until_idle()
    assert lost
    assert (reqs[0].finish_reason, reqs[0].error) == ("error", "RuntimeError: a made-up lost copy")
    assert (reqs[1].finish_reason, reqs[1].error) == ("length", None) and reqs[1].extra["chunks"]
    assert not loop.busy and not loop.scheduler.requests


def test_vox_early_pcm_takes_0_or_1_and_refuses_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    from vox_serve.worker.engine_worker import early_pcm_enabled

    monkeypatch.delenv("VOX_EARLY_PCM", raising=False)
    assert early_pcm_enabled()
    monkeypatch.setenv("VOX_EARLY_PCM", "0")
    assert not early_pcm_enabled()
    monkeypatch.setenv("VOX_EARLY_PCM", "yes")
    with pytest.raises(ValueError, match="VOX_EARLY_PCM='yes': expected 1"):
        early_pcm_enabled()

"""--enable-disaggregation on CPU, in both runtimes: the LM half and the codec half are two engines (own state,
arenas, pools), the codec rows' inputs cross in one copy per step, and the audio is byte-identical to the whole
engine's: in bench mode for orpheus-tiny, qwen3-tts-tiny (a voice design and an in-context clone, whose codec
slots are primed on the codec half) and csm-tiny, each runtime's split engine equal to its whole engine and to the
Python runtime's. The runtime rules: both runtimes take the flag; `auto` keeps choosing as without it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import torch
from rust_helpers import require_rt

from tests.engine_helpers import prepare, spec_of
from tests.orpheus_helpers import run_requests
from vox_serve import launch
from vox_serve.cli import PY, RS, check_flags, given_flags, python_only_flags
from vox_serve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.core.meta import CODEC_PREFIX
from vox_serve.core.plan import LmLaunch, PageUpdates, SlotInit, StepPlan
from vox_serve.core.stages import EngineHalf, Stage
from vox_serve.engine.build import engine_of_program, load_program
from vox_serve.engine.disagg import split_program
from vox_serve.engine.registry import get_engine
from vox_serve.engine_loop import EngineLoop
from vox_serve.request_builder import build_request
from vox_serve.rt.program import Program
from vox_serve.rust_host import _request_data
from vox_serve.scheduler.factory import make_scheduler
from vox_serve.worker.disagg_worker import make_worker, split_plan

REPO = Path(__file__).resolve().parents[1]
BENCH = {"max_tokens": 28, "ignore_eos": True}
RUNTIMES = [PY, RS]


def _bench(runtime: str, out: Path, model: str, kwargs: str, *extra: str) -> tuple[dict[str, bytes], str]:
    """(the WAV files by name, stderr) of a greedy bench run of two requests."""
    cmd = [sys.executable, "-m", "vox_serve.launch", "--runtime", runtime, "--model", model, "--device", "cpu",
           "--bench-requests", "2", "--greedy", "--bench-out", str(out), "--bench-kwargs", kwargs, *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {f.name: f.read_bytes() for f in sorted(out.glob("*.wav"))}, proc.stderr


def _clip(path: Path) -> Path:
    t = np.arange(int(24000 * 1.2)) / 24000
    soundfile.write(path, (0.4 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def python_whole(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict[str, bytes]]:
    """The Python runtime's whole-engine WAVs of a bench case, run once for both runtimes' tests."""
    cache: dict[tuple[str, str], dict[str, bytes]] = {}

    def run(model: str, kwargs: str, *extra: str) -> dict[str, bytes]:
        if (model, kwargs) not in cache:
            cache[(model, kwargs)], _ = _bench(PY, tmp_path_factory.mktemp("whole"), model, kwargs, *extra)
        return cache[(model, kwargs)]

    return run


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("model,fields", [
    ("orpheus-tiny", BENCH),
    ("qwen3-tts-tiny", BENCH),
    ("qwen3-tts-base-tiny", {**BENCH, "ref_text": "A clip.", "non_streaming_mode": False}),
    ("csm-tiny", BENCH),
])
def test_disaggregated_bench_output_is_byte_identical(tmp_path: Path, python_whole: Callable[..., dict[str, bytes]],
                                                      runtime: str, model: str, fields: dict) -> None:
    if runtime == RS:
        require_rt()
    extra = ("--bench-audio", str(_clip(tmp_path / "clip.wav"))) if "ref_text" in fields else ()
    kwargs = json.dumps(fields)
    reference = python_whole(model, kwargs, *extra)
    assert list(reference) == ["bench-000.wav", "bench-001.wav"]
    if runtime == RS:
        whole, _ = _bench(runtime, tmp_path / "whole", model, kwargs, *extra)
        assert whole == reference
    split, log = _bench(runtime, tmp_path / "split", model, kwargs, *extra, "--enable-disaggregation")
    assert "(lm half)" in log and "(codec half)" in log  # two engines were built
    assert split == reference
    pcm = np.frombuffer(reference["bench-000.wav"][44:], dtype="<i2")
    assert pcm.size > 0 and np.abs(pcm.astype(np.int32)).max() > 0  # real audio, not two empty files


def _config(model: str, **scheduler: int) -> VoxConfig:
    return VoxConfig(model=ModelConfig(model=model, device="cpu"), cache=CacheConfig(max_num_pages=64),
                     scheduler=SchedulerConfig(max_batch_size=4, max_prefill_tokens=256, max_codec_batch=4,
                                               **scheduler),
                     engine=EngineConfig(enable_disaggregation=True))


def _pcm(runtime: str, program: Program, config: VoxConfig, spec: dict[str, Any],
         field_sets: list[dict[str, Any]]) -> list[bytes]:
    """Each request's PCM (greedy), run to completion on the engine of `spec` (one engine or a disaggregated
    pair) by `runtime`'s scheduler and worker."""
    if runtime == PY:
        scheduler = make_scheduler(program.meta, program.limits, config.scheduler)
        loop = EngineLoop(scheduler, make_worker(spec), record=True)
        return [b"".join(req.extra["chunks"]) for req in run_requests(program, config, field_sets, loop=loop)]
    reqs = [build_request(program.meta, program.preprocess, fields, f"r{i}", greedy=True, seed=i)
            for i, fields in enumerate(field_sets)]
    out = require_rt().run_requests(json.dumps(spec), json.dumps(dataclasses.asdict(config.scheduler)),
                                    json.dumps([_request_data(req) for req in reqs]))
    assert [(req_id, error) for req_id, _, error, _, _ in out] == [(req.req_id, None) for req in reqs]
    return [pcm for *_, pcm in out]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_halves_own_distinct_state_and_the_codec_reads_only_the_hand_over(runtime: str) -> None:
    config = _config("qwen3-tts-tiny")
    program = load_program(config)
    spec = engine_of_program(program, config, report=False)
    lm, codec = (get_engine(spec[half]["engine_id"]).program for half in ("lm", "codec"))
    assert (lm.half, codec.half) == (EngineHalf.LM, EngineHalf.CODEC) and lm is program
    assert lm.codec_slots is None and codec.codec_slots is not None  # the codec's pools: codec half only
    assert lm.predictor is codec.predictor  # weights are shared (on a CPU both halves' device)
    for name in ("step_in", "step_out"):
        assert lm.arenas[name].layout()["device_ptr"] != codec.arenas[name].layout()["device_ptr"]
    assert lm.state.codes.data_ptr() != codec.state.codes.data_ptr()
    # the LM half's codec stage is the hand-over gather; the codec half runs no LM stage
    assert set(spec["lm"]["stages"]) == {Stage.PROLOGUE, Stage.PREFILL, Stage.DECODE, Stage.CODEC}
    assert set(spec["codec"]["stages"]) == {Stage.PROLOGUE, Stage.CODEC}

    (pcm,) = _pcm(runtime, program, config, spec, [{"text": "Hello.", **BENCH}])
    chunk_bytes = 2 * program.limits.frames_per_chunk * program.meta.samples_per_frame
    assert len(pcm) > chunk_bytes  # several chunks
    assert lm.state.codes.abs().sum() > 0
    assert codec.state.codes.abs().sum() == 0  # every code the codec decoded came through the hand-over


def test_split_plan_gives_each_half_its_part() -> None:
    admit = SlotInit(slot=3, prompt_len=5, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                     repetition_window=8, seed=1, allow_stop=True,
                     conditioning={CODEC_PREFIX: np.ones((2, 4), dtype=np.int32), "cond": np.zeros(2)})
    rows = LmLaunch(["r"], np.array([3]), np.array([0]), np.array([5]), np.array([True]), np.zeros((5, 1), np.int32))
    plan = StepPlan(7, admits=[admit], pages=PageUpdates(np.array([3]), np.array([0]), np.array([9])), prefill=rows)
    lm, codec = split_plan(plan)
    assert lm.step_id == codec.step_id == 7
    assert set(lm.admits[0].conditioning) == {"cond"} and lm.prefill is rows and len(lm.pages) == 1
    assert set(codec.admits[0].conditioning) == {CODEC_PREFIX, "cond"}
    assert not len(codec.pages) and not len(codec.prefill) and not len(codec.decode)
    assert CODEC_PREFIX in admit.conditioning  # the plan itself is left as it was


def test_a_program_that_does_not_declare_its_codec_cannot_be_split() -> None:
    from tests.paired_program import PairedProgram

    with pytest.raises(NotImplementedError, match="codec_modules"):
        split_program(PairedProgram(), torch.device("cpu"))


def test_both_runtimes_take_disaggregation() -> None:
    for runtime in RUNTIMES:
        kept, _ = check_flags(given_flags(["--enable-disaggregation"]), runtime, rust_missing=False)
        assert kept["enable_disaggregation"] is True
    assert python_only_flags(given_flags(["--enable-disaggregation", "--model", "orpheus-tiny"])) == []
    assert python_only_flags(given_flags(["--enable-disaggregation", "--async-scheduling"])) == ["--async-scheduling"]


def test_auto_keeps_the_rust_runtime_with_disaggregation(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """Where the Rust runtime serves the rest of the command line, the flag does not move it to Python."""
    served: list[VoxConfig] = []
    monkeypatch.setattr(launch, "select_runtime", lambda requested, bench=False: (RS, None))
    monkeypatch.setattr(launch, "_serve_rust", lambda config: served.append(config) or 0)
    assert launch.main(["--model", "orpheus-tiny", "--enable-disaggregation", "--bench-requests", "1"]) == 0
    assert served[0].runtime == RS and served[0].engine.enable_disaggregation
    assert "Python runtime" not in capsys.readouterr().err


def test_rust_serves_disaggregation_in_bench_mode_and_says_so_for_http(capsys: pytest.CaptureFixture) -> None:
    """This build's Rust runtime serves no HTTP, with or without the flag: `--runtime rust` says so (it is not
    the flag that is refused) and `auto` serves HTTP with Python."""
    require_rt()
    assert launch.main(["--runtime", "rust", "--model", "orpheus-tiny", "--device", "cpu",
                        "--enable-disaggregation"]) == 2
    err = capsys.readouterr().err
    assert "bench mode" in err and "--runtime python" in err and "--enable-disaggregation" not in err
    runtime, reason = launch.select_runtime("auto")
    assert runtime == PY and "bench mode" in str(reason)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_first_codec_chunk_crosses_too(runtime: str) -> None:
    """--first-chunk-frames: the codec_first windows are handed over beside the codec ones."""
    config = _config("orpheus-tiny", first_chunk_frames=1, detokenize_interval=2)
    reference = dataclasses.replace(config, engine=EngineConfig())
    fields = [{"text": "Hi.", "max_tokens": 70, "ignore_eos": True}]
    whole = prepare(load_program(reference), reference)
    (req,) = run_requests(whole, reference, fields)  # the Python runtime's whole engine, chunk by chunk
    chunks = req.extra["chunks"]
    spf = whole.meta.samples_per_frame
    assert len(chunks) >= 3 and len(chunks[0]) == 2 * spf < len(chunks[1])  # a one-frame first chunk
    split = load_program(config)
    split_spec = engine_of_program(split, config, report=False)
    assert "codec_first" in split_spec["lm"]["stages"] and "codec_first" in split_spec["codec"]["stages"]
    assert _pcm(runtime, whole, reference, spec_of(whole), fields) == [b"".join(chunks)]
    assert _pcm(runtime, split, config, split_spec, fields) == [b"".join(chunks)]

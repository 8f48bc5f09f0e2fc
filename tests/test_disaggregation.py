"""--enable-disaggregation on CPU: the LM half and the codec half are two engines (own state, arenas, pools),
the codec rows' inputs cross in one copy per step, and the audio is byte-identical to the whole engine's:
in bench mode for orpheus-tiny, qwen3-tts-tiny (a voice design and an in-context clone, whose codec slots
are primed on the codec half) and csm-tiny. The runtime rules: Rust refuses it, auto picks Python."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from tests.engine_helpers import make_loop, prepare
from tests.orpheus_helpers import run_requests
from vox_serve import launch
from vox_serve.cli import PY, RS, CliError, check_flags, given_flags, python_only_flags
from vox_serve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.core.meta import CODEC_PREFIX
from vox_serve.core.plan import LmLaunch, PageUpdates, SlotInit, StepPlan
from vox_serve.core.stages import EngineHalf, Stage
from vox_serve.engine.build import load_program
from vox_serve.engine.disagg import split_program
from vox_serve.engine.registry import get_engine
from vox_serve.worker.disagg_worker import split_plan

REPO = Path(__file__).resolve().parents[1]
BENCH = {"max_tokens": 28, "ignore_eos": True}


def _bench(out: Path, model: str, kwargs: str, *extra: str) -> dict[str, bytes]:
    cmd = [sys.executable, "-m", "vox_serve.launch", "--runtime", "python", "--model", model, "--device", "cpu",
           "--bench-requests", "2", "--greedy", "--bench-out", str(out), "--bench-kwargs", kwargs, *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {f.name: f.read_bytes() for f in sorted(out.glob("*.wav"))}


def _clip(path: Path) -> Path:
    t = np.arange(int(24000 * 1.2)) / 24000
    soundfile.write(path, (0.4 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000, subtype="PCM_16")
    return path


@pytest.mark.parametrize("model,fields", [
    ("orpheus-tiny", BENCH),
    ("qwen3-tts-tiny", BENCH),
    ("qwen3-tts-base-tiny", {**BENCH, "ref_text": "A clip.", "non_streaming_mode": False}),
    ("csm-tiny", BENCH),
])
def test_disaggregated_bench_output_is_byte_identical(tmp_path: Path, model: str, fields: dict) -> None:
    extra = ("--bench-audio", str(_clip(tmp_path / "clip.wav"))) if "ref_text" in fields else ()
    whole = _bench(tmp_path / "whole", model, json.dumps(fields), *extra)
    split = _bench(tmp_path / "split", model, json.dumps(fields), *extra, "--enable-disaggregation")
    assert list(whole) == ["bench-000.wav", "bench-001.wav"]
    assert split == whole
    pcm = np.frombuffer(whole["bench-000.wav"][44:], dtype="<i2")
    assert pcm.size > 0 and np.abs(pcm.astype(np.int32)).max() > 0  # real audio, not two empty files


def _config(model: str, **scheduler: int) -> VoxConfig:
    return VoxConfig(model=ModelConfig(model=model, device="cpu"), cache=CacheConfig(max_num_pages=64),
                     scheduler=SchedulerConfig(max_batch_size=4, max_prefill_tokens=256, max_codec_batch=4,
                                               **scheduler),
                     engine=EngineConfig(enable_disaggregation=True))


def test_the_halves_own_distinct_state_and_the_codec_reads_only_the_hand_over() -> None:
    config = _config("qwen3-tts-tiny")
    program = load_program(config)
    loop = make_loop(program, config, disaggregated=True)
    worker = loop.worker
    lm, codec = (get_engine(w.spec["engine_id"]).program for w in (worker.lm, worker.codec))
    assert (lm.half, codec.half) == (EngineHalf.LM, EngineHalf.CODEC) and lm is program
    assert lm.codec_slots is None and codec.codec_slots is not None  # the codec's pools: codec half only
    assert lm.predictor is codec.predictor  # weights are shared (on a CPU both halves' device)
    for name in ("step_in", "step_out"):
        assert lm.arenas[name].layout()["device_ptr"] != codec.arenas[name].layout()["device_ptr"]
    assert lm.state.codes.data_ptr() != codec.state.codes.data_ptr()
    # the LM half's codec stage is the hand-over gather; the codec half runs no LM stage
    assert set(worker.lm.buckets) == {Stage.PROLOGUE, Stage.PREFILL, Stage.DECODE, Stage.CODEC}
    assert set(worker.codec.buckets) == {Stage.PROLOGUE, Stage.CODEC}

    (req,) = run_requests(program, config, [{"text": "Hello.", **BENCH}], loop=loop)
    assert len(req.extra["chunks"]) >= 2
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


def test_rust_refuses_disaggregation_and_names_the_python_runtime() -> None:
    with pytest.raises(CliError, match=r"--enable-disaggregation is not implemented yet in the rust runtime; "
                                       r"the python runtime serves it \(--runtime python\)"):
        check_flags(given_flags(["--enable-disaggregation"]), RS, rust_missing=False)
    kept, _ = check_flags(given_flags(["--enable-disaggregation"]), PY, rust_missing=False)
    assert kept["enable_disaggregation"] is True
    assert python_only_flags(given_flags(["--enable-disaggregation", "--model", "orpheus-tiny"])) == \
        ["--enable-disaggregation"]
    assert python_only_flags(given_flags(["--urgent-lane"])) == []


def test_auto_serves_disaggregation_with_python_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    """Even where the Rust runtime would serve the rest of the command line."""
    import vox_serve.bench

    served: list[VoxConfig] = []
    monkeypatch.setattr(launch, "select_runtime", lambda requested, bench=False: (RS, None))
    monkeypatch.setattr(launch, "_serve_rust", lambda config: pytest.fail("the Rust runtime was chosen"))
    monkeypatch.setattr(vox_serve.bench, "run_bench", lambda config: served.append(config) or 0)
    assert launch.main(["--model", "orpheus-tiny", "--enable-disaggregation", "--bench-requests", "1"]) == 0
    assert served[0].runtime == PY and served[0].engine.enable_disaggregation
    assert "serving with the Python runtime: --enable-disaggregation is served by it only" in capsys.readouterr().err


def test_the_first_codec_chunk_crosses_too() -> None:
    """--first-chunk-frames: the codec_first windows are handed over beside the codec ones."""
    config = _config("orpheus-tiny", first_chunk_frames=1, detokenize_interval=2)
    reference = dataclasses.replace(config, engine=EngineConfig())
    audio = []
    for cfg, split in ((reference, False), (config, True)):
        program = load_program(cfg)
        if not split:
            prepare(program, cfg)
        loop = make_loop(program, cfg, disaggregated=split)
        (req,) = run_requests(program, cfg, [{"text": "Hi.", "max_tokens": 70, "ignore_eos": True}], loop=loop)
        audio.append(req.extra["chunks"])
    spf = program.meta.samples_per_frame
    assert len(audio[0]) >= 3 and len(audio[0][0]) == 2 * spf < len(audio[0][1])  # a one-frame first chunk
    assert audio[1] == audio[0]

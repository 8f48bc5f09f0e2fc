"""Qwen3-TTS test machinery: the reference venv, tiny checkpoints it writes, and running our program.

The reference (PyPI qwen-tts 0.1.1, transformers 4.57.3) lives in its own venv (scripts/
setup_qwen_reference.sh) and runs in a subprocess: tests/qwen_ref/talker_ref.py. Without it the tests
that need it skip, unless VOX_REQUIRE_QWEN_REF=1, which turns the skip into a failure.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import orpheus_helpers
import pytest
import soundfile
import torch

from tests.engine_helpers import engine_worker, make_loop, prepare
from vox_serve import ipc
from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.engine_loop import EngineLoop
from vox_serve.models.qwen3_tts.loader import (
    QWEN3_TTS_TINY_BASE_CONFIG,
    QWEN3_TTS_TINY_CONFIG,
    TINY_CODEC_CONFIG,
    load_qwen3_tts,
)
from vox_serve.models.tokenizers.qwen2 import save_tokenizer_files, tiny_qwen2_tokenizer
from vox_serve.scheduler.base import Scheduler
from vox_serve.scheduler.factory import make_scheduler
from vox_serve.scheduler_entry import SchedulerService

ROOT = Path(__file__).resolve().parents[1]
REF_PYTHON = Path(os.environ.get("QWEN_REF_PYTHON", ROOT / ".venv-qwen" / "bin" / "python"))
REF_SCRIPT = Path(__file__).parent / "qwen_ref" / "talker_ref.py"
CLONE_SCRIPT = Path(__file__).parent / "qwen_ref" / "clone_ref.py"  # the Base model's reference


def require_reference(package: str = "qwen_tts") -> Path:
    """The reference interpreter, or skip (fail with VOX_REQUIRE_QWEN_REF=1) saying why it is missing.
    `package`: what the test needs there besides qwen_tts (the Base model's reference needs librosa)."""
    why = None
    if not REF_PYTHON.exists():
        why = f"{REF_PYTHON} does not exist (run scripts/setup_qwen_reference.sh)"
    else:
        probe = f"import importlib.util as u, sys; sys.exit(not all(u.find_spec(p) for p in ('qwen_tts', '{package}')))"
        if subprocess.run([str(REF_PYTHON), "-c", probe], capture_output=True, timeout=120).returncode != 0:
            why = f"{REF_PYTHON} lacks qwen_tts or {package} (run scripts/setup_qwen_reference.sh)"
    if why is not None:
        if os.environ.get("VOX_REQUIRE_QWEN_REF") == "1":
            pytest.fail(f"Qwen3-TTS reference required but unavailable: {why}")
        pytest.skip(f"Qwen3-TTS reference unavailable: {why}")
    return REF_PYTHON


def run_reference(*args: str | Path, timeout: int = 900, script: Path = REF_SCRIPT) -> None:
    proc = subprocess.run([str(require_reference()), str(script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"reference {args[0]} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")


def write_tiny_checkpoint(path: Path, config: dict | None = None, seed: int = 0, audible_codec: bool = False) -> Path:
    """A tiny config (default QWEN3_TTS_TINY_CONFIG) written by the reference (save_pretrained), with our
    tiny tokenizer's files; `audible_codec`: random codec decoder weights (else it decodes to silence)."""
    path.mkdir(parents=True, exist_ok=True)
    save_tokenizer_files(tiny_qwen2_tokenizer(), path)
    spec = {**(config or QWEN3_TTS_TINY_CONFIG), "_seed": seed,
            "_speech_tokenizer_decoder": TINY_CODEC_CONFIG["decoder_config"], "_audible_codec": audible_codec}
    (path.parent / f"{path.name}-build.json").write_text(json.dumps(spec))
    run_reference("build", path.parent / f"{path.name}-build.json", path)
    return path


def voice_design_copy(ckpt: Path, path: Path) -> Path:
    """The same weights declared as a VoiceDesign model (no named speakers)."""
    path.mkdir(parents=True, exist_ok=True)
    for item in ckpt.iterdir():
        if item.name != "config.json":
            (path / item.name).symlink_to(item)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["tts_model_type"] = "voice_design"
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def reference_wavs(rate: int = 24000) -> dict[str, bytes]:
    """Voice-clone reference clips as PCM16 WAV (24 kHz: no resampling): lengths on and off the
    1920-sample frame grid."""
    rng = np.random.default_rng(7)
    t = np.arange(int(2.3 * rate)) / rate
    clips = {
        "sine": 0.4 * np.sin(2 * np.pi * 220 * t) + 0.1 * rng.standard_normal(t.size),
        "noise": rng.uniform(-0.5, 0.5, 3 * rate),  # exactly 37.5 frames: not a whole number
        "chirp": 0.6 * np.sin(2 * np.pi * (100 + 400 * t[: int(1.5 * rate)]) * t[: int(1.5 * rate)]),
    }
    out = {}
    for name, x in clips.items():
        buf = io.BytesIO()
        soundfile.write(buf, x.astype(np.float32), rate, subtype="PCM_16", format="WAV")
        out[name] = buf.getvalue()
    return out


def make_program(ckpt: Path, eos_scale: float = 1.0, max_num_pages: int = 128, frames_per_chunk: int | None = None,
                 max_batch: int = 8):
    program = load_qwen3_tts(str(ckpt), "auto", torch.device("cpu"), torch.float32, seed=0, max_model_len=512)
    with torch.no_grad():
        program.talker.codec_head.weight[program.ids.codec_eos] *= eos_scale
    config = VoxConfig(model=ModelConfig(model=str(ckpt), device="cpu"),
                       cache=CacheConfig(page_size=16, max_num_pages=max_num_pages),
                       scheduler=SchedulerConfig(max_batch_size=max_batch, max_prefill_tokens=256,
                                                 detokenize_interval=frames_per_chunk))
    return prepare(program, config), config


def run_requests(program, config, field_sets: list[dict], greedy: bool = True,
                 async_scheduling: bool = False) -> tuple[list, EngineLoop]:
    """Run requests to completion through the real scheduler and worker; returns them and the loop."""
    loop = make_loop(program, config, async_scheduling=async_scheduling)
    return orpheus_helpers.run_requests(program, config, field_sets, loop, greedy), loop


def case_fields(case: dict, frames: int) -> dict:
    """A reference case as our request fields; `frames` = the reference's max_new_tokens - 1 (its last
    sampled group-0 code never gets a frame)."""
    fields = {"text": case["text"], "voice": case.get("speaker"), "language": case.get("language"),
              "instruct": case.get("instruct"), "max_tokens": frames}
    return {k: v for k, v in fields.items() if v is not None}


class StreamingDriver:
    """Input-streaming sessions through the scheduler process's message handling (no ZMQ, no HTTP),
    greedy, stepped by hand: text pieces can arrive between any two steps."""

    def __init__(self, program, config, policy: str = "base", async_scheduling: bool = False) -> None:
        config = dataclasses.replace(config, bench=dataclasses.replace(config.bench, greedy=True))
        scheduler = make_scheduler(program.meta, program.limits,
                                   dataclasses.replace(config.scheduler, scheduler_type=policy))
        self.loop = EngineLoop(scheduler, engine_worker(program), async_scheduling=async_scheduling, record=True)
        self.sent: list = []
        self.service = SchedulerService(self.loop, program.preprocess, config, self.receive, streamer=program)
        self.scheduler = scheduler
        self.reqs: dict = {}  # req_id -> Request, once started

    def receive(self, msg: object) -> None:
        """As the API dispatches it: a step's AudioBatch as its chunks."""
        self.sent.extend(ipc.request_events(msg))

    def start(self, req_id: str, fields: dict, audio: bytes = b"") -> None:
        self.service.handle(ipc.Submit(req_id, fields, 0, input_streaming=True, audio=audio))

    def text(self, req_id: str, piece: str) -> None:
        self.service.handle(ipc.AppendText(req_id, piece))
        self._record()

    def end(self, req_id: str) -> None:
        self.service.handle(ipc.EndText(req_id))
        self._record()

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.service.step()

    def finish(self, timeout_s: float = 120.0) -> None:
        """Step until idle, waiting as the loop asks (policies that hold audio back wait for the clock)."""
        deadline = time.monotonic() + timeout_s
        while self.service.busy:
            if time.monotonic() > deadline:
                raise AssertionError("the loop did not go idle")
            time.sleep(self.service.step())

    def events(self, req_id: str, kind: type) -> list:
        return [m for m in self.sent if getattr(m, "req_id", None) == req_id and isinstance(m, kind)]

    def _record(self) -> None:
        self.reqs.update(self.scheduler.requests)


def count_preemptions(monkeypatch) -> list[str]:  # noqa: ANN001
    """The ids of requests the scheduler preempts from now on (appended as it happens)."""
    preempted: list[str] = []
    real = Scheduler._preempt

    def counting(self, req) -> None:  # noqa: ANN001
        preempted.append(req.req_id)
        real(self, req)

    monkeypatch.setattr(Scheduler, "_preempt", counting)
    return preempted


def clone_reference(root: Path, cases: list[dict]) -> tuple[Path, dict[str, bytes], list[dict[str, torch.Tensor]]]:
    """The tiny Base checkpoint (written under `root`), the reference clips, and what the reference's
    clone script returns for `cases` (its case fields, with `clip` naming the reference clip): per case
    its tensors by name (codes, embeds, ...)."""
    from safetensors.torch import load_file

    require_reference("librosa")
    ckpt = write_tiny_checkpoint(root / "base", QWEN3_TTS_TINY_BASE_CONFIG, seed=5, audible_codec=True)
    wavs = reference_wavs()
    for name, data in wavs.items():
        (root / f"{name}.wav").write_bytes(data)
    full = [{"ckpt": str(ckpt), "ref_audio": str(root / f"{case['clip']}.wav"),
             **{k: v for k, v in case.items() if k != "clip"}} for case in cases]
    (root / "cases.json").write_text(json.dumps(full))
    run_reference("clone", root / "cases.json", root / "ref", script=CLONE_SCRIPT)
    tensors = load_file(root / "ref" / "reference.safetensors")
    return ckpt, wavs, [{k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"{i}.")}
                        for i in range(len(cases))]

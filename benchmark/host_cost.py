"""Host cost per step: the real scheduler and worker over a null engine, at the real models' geometry.

    python benchmark/host_cost.py [--batches 1,64,256] [--steps 300] [--repeats 1] [--models orpheus,qwen3-tts]
                                  [--out FILE] [--runtime python|rust]

A null engine has the real step arenas, slot tables and spec (Orpheus-3B or Qwen3-TTS-1.7B geometry:
input columns, codes per step and frame, chunk windows, max_model_len), and stages that do nothing:
every LM row comes back AUDIO (the output arena holds zeros), so every request decodes at steady
state and its chunks become ready at the model's rate, as in a long-running batch. What is timed is
everything the host does per step -- scheduling, writing the step arena, the launch calls, reading
the outputs, applying them -- i.e. the cost a runtime adds on top of the device.

`--runtime rust` measures, in the same run, the Python runtime and the Rust runtime's scheduler and
engine driver (`vox_serve._rt.host_cost`) over the same null engine, twice: `rust` calls the
spec's callable stage handles and planner through Python (the CPU launch path: the only Python per
step), `rust-host` calls nothing (the host's own cost; on a GPU each launch adds one cudaGraphLaunch).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig  # noqa: E402
from vox_serve.core.meta import ProgramMeta  # noqa: E402
from vox_serve.core.request import Prompt, Request, SamplingParams  # noqa: E402
from vox_serve.core.stages import Stage  # noqa: E402
from vox_serve.engine.build import engine_of_program  # noqa: E402
from vox_serve.engine.registry import engine_of  # noqa: E402
from vox_serve.engine.spec import engine_spec  # noqa: E402
from vox_serve.engine_loop import EngineLoop  # noqa: E402
from vox_serve.models.orpheus.program import orpheus_meta  # noqa: E402
from vox_serve.models.qwen3_tts.loader import QWEN3_TTS_CONFIG  # noqa: E402
from vox_serve.models.qwen3_tts.program import qwen3_tts_meta  # noqa: E402
from vox_serve.models.qwen3_tts.prompt import PromptIds  # noqa: E402
from vox_serve.rt.program import Program  # noqa: E402
from vox_serve.scheduler.factory import make_scheduler  # noqa: E402
from vox_serve.worker.engine_worker import EngineWorker  # noqa: E402

PROMPT_LEN = 40


class NullProgram(Program):
    """Real arenas and slot state, stages that do nothing."""

    def __init__(self, meta: ProgramMeta) -> None:
        super().__init__(torch.device("cpu"), torch.float32)
        self.meta = meta

    def kv_geometry(self) -> tuple[int, int, int, int]:
        return 1, 1, 1, 8  # the KV cache is never touched

    def run_stage(self, stage: Stage, bucket: int, num_seqs: int | None = None) -> None:
        return None

    def preprocess(self, fields: dict[str, Any]) -> Prompt:
        raise NotImplementedError

    def lm_step(self, batch: Any) -> Any:
        raise NotImplementedError

    def decode_audio(self, window: Any, frames: int) -> Any:
        raise NotImplementedError


def geometry(model: str) -> ProgramMeta:
    if model == "orpheus":
        return orpheus_meta("orpheus (null engine)", 4096, constrain_audio=True)
    ids = PromptIds.from_config(QWEN3_TTS_CONFIG)
    return qwen3_tts_meta("qwen3-tts (null engine)", ids, 4096, QWEN3_TTS_CONFIG["talker_config"]["hidden_size"])


def null_engine(model: str, batch: int, steps: int, policy: str) -> tuple[ProgramMeta, NullProgram, VoxConfig, int]:
    """A built null engine of the model's geometry: (meta, program, config, max_tokens)."""
    meta = geometry(model)
    max_tokens = 10 * steps + PROMPT_LEN
    pages_per_seq = -(-(PROMPT_LEN + max_tokens) // 16)
    config = VoxConfig(model=ModelConfig(model="null", device="cpu"),
                       cache=CacheConfig(max_num_pages=batch * pages_per_seq + 8),
                       scheduler=SchedulerConfig(scheduler_type=policy, max_batch_size=batch, max_codec_batch=batch,
                                                 max_prefill_seqs=16, max_prefill_tokens=2048))
    program = NullProgram(meta)
    engine_of_program(program, config, report=False)
    return meta, program, config, max_tokens


def measure_rust(model: str, batch: int, steps: int, policy: str, launcher: str) -> dict[str, Any]:
    """The Rust scheduler and driver over a fresh null engine (`launcher`: python or null)."""
    from dataclasses import asdict

    from vox_serve import _rt

    _, program, config, max_tokens = null_engine(model, batch, steps, policy)
    spec = json.dumps(engine_spec(engine_of(program)))
    per_step, rows, codec_rows = _rt.host_cost(spec, json.dumps(asdict(config.scheduler)), launcher, batch, steps,
                                               PROMPT_LEN, max_tokens)
    assert rows == batch * steps, "every request decodes every step"
    runtime = "rust" if launcher == "python" else "rust-host"
    return {"model": model, "runtime": runtime, "policy": policy, "batch": batch,
            "host_us_per_step": round(per_step * 1e6, 1), "codec_rows_per_step": round(codec_rows / steps, 2),
            "steps": steps}


def measure(model: str, batch: int, steps: int, policy: str, repeats: int = 1) -> dict[str, Any]:
    """The Python runtime: `repeats` passes of `steps` steps; the figure is the median pass's mean (a shared
    machine's noise moves single passes by tens of percent), the passes are listed too."""
    meta, program, config, max_tokens = null_engine(model, batch, steps * repeats, policy)
    worker = EngineWorker(engine_spec(engine_of(program)))
    scheduler = make_scheduler(meta, program.limits, config.scheduler)
    loop = EngineLoop(scheduler, worker)
    ids = np.zeros((PROMPT_LEN, meta.input_columns), dtype=np.int32)
    for i in range(batch):
        scheduler.add_request(Request(f"r{i}", Prompt.of(ids), SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    while scheduler.waiting or not scheduler.running:  # admit everything, then measure the steady state
        loop.step()
    for _ in range(20):
        loop.step()
    codec_rows = rows = 0
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            plan = scheduler.schedule()
            result = worker.execute(plan)
            scheduler.update(plan, result)
            rows += len(plan.decode)
            codec_rows += len(plan.codec)
        passes.append((time.perf_counter() - start) / steps * 1e6)
    assert rows == batch * steps * repeats, "every request decodes every step"
    return {"model": model, "runtime": "python", "policy": policy, "batch": batch,
            "host_us_per_step": round(float(np.median(passes)), 1),
            "codec_rows_per_step": round(codec_rows / (steps * repeats), 2), "steps": steps,
            "passes_us": [round(x, 1) for x in passes]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="orpheus,qwen3-tts")
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--policy", default="base")
    p.add_argument("--repeats", type=int, default=1,
                   help="passes of --steps steps per row (Python runtime); the median pass is reported")
    p.add_argument("--runtime", choices=["python", "rust"], default="python",
                   help="rust: also the Rust runtime, in the same run")
    p.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for model in args.models.split(","):
        for batch in map(int, args.batches.split(",")):
            found = [measure(model, batch, args.steps, args.policy, args.repeats)]
            if args.runtime == "rust":
                found += [measure_rust(model, batch, args.steps, args.policy, how) for how in ("python", "null")]
            for row in found:
                rows.append(row)
                ratio = found[0]["host_us_per_step"] / max(row["host_us_per_step"], 1e-3)
                print(f"{row['model']:<10} {row['runtime']:<9} {row['policy']:<8} batch {batch:>4}: "
                      f"{row['host_us_per_step']:>8.1f} us/step ({row['codec_rows_per_step']} codec rows/step)"
                      + (f", {ratio:.1f}x less than python" if row["runtime"] != "python" else ""), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"runtime": args.runtime, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

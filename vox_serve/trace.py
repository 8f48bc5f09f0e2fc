"""`--trace-dir`: JSON lines of every scheduling decision and every stage launch (pure Python).

One file per engine loop (`trace-<pid>-<n>.jsonl`). Records:
- `{"type": "header", "meta": ..., "limits": ..., "scheduler": ...}` once;
- `{"type": "schedule", "step", "t", "policy", "plan_ms", "codec": [[req, chunk, why]],
  "prefill": [[req, tokens, why]], "decode": [[req, why]], "notes": [...], "queue": {...},
  "kv": {...}}` per step: what was planned, why, and the queue and KV state it was planned in;
- `{"type": "stage", "step", "stage", "rows", "tokens", "device_ms", "timer"}` per stage launch:
  device time from CUDA events on a GPU, wall time on a CPU, the cost model in a simulation.
`vox_serve.sim.calibrate` fits a simulator cost profile from the stage records.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from vox_serve.core.plan import StepPlan, StepResult
from vox_serve.scheduler.base import Scheduler

_files = itertools.count()


def _meta(scheduler: Scheduler) -> dict:
    """The program meta of a trace header, without the prompt builder's inputs (a tokenizer's JSON)."""
    meta = scheduler.meta.to_dict()
    meta.pop("prompt_builder", None)
    return meta


class Tracer:
    def __init__(self, trace_dir: str | Path, timer: str = "wall") -> None:
        directory = Path(trace_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"trace-{os.getpid()}-{next(_files)}.jsonl"
        self.timer = timer
        self._file = self.path.open("w", encoding="utf-8", buffering=1)  # line-buffered: readable while serving

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")

    def header(self, scheduler: Scheduler) -> None:
        self.write({"type": "header", "policy": scheduler.name, "timer": self.timer,
                    "meta": _meta(scheduler), "limits": asdict(scheduler.limits),
                    "scheduler": asdict(scheduler.config)})

    def decision(self, scheduler: Scheduler, plan: StepPlan, plan_seconds: float) -> None:
        why = scheduler.reasons
        codec = [[r.req_id, r.chunk_index, why.get("codec", {}).get(r.req_id, "")] for r in plan.codec]
        prefill = [[r.req_id, r.num_tokens, why.get("prefill", {}).get(r.req_id, "")] for r in plan.prefill]
        decode = [[rid, why.get("decode", {}).get(rid, "running")] for rid in plan.decode.req_ids]
        pool = scheduler.pool
        self.write({
            "type": "schedule", "step": plan.step_id, "t": scheduler.now, "policy": scheduler.name,
            "plan_ms": plan_seconds * 1000, "codec": codec, "prefill": prefill, "decode": decode,
            "admits": [a.slot for a in plan.admits], "page_updates": len(plan.pages), "notes": scheduler.notes,
            "queue": {"waiting": len(scheduler.waiting), "running": len(scheduler.running),
                      "draining": len(scheduler.draining), "in_flight_steps": scheduler.num_in_flight,
                      # codec batches still on the device after their steps: only the Rust runtime's
                      # --overlap-detok leaves any; this runtime collects each with its step
                      "codec_in_flight": 0},
            "kv": {"free_pages": pool.num_free, "used_pages": pool.num_usable - pool.num_free,
                   "usable_pages": pool.num_usable},
        })

    def stages(self, plan: StepPlan, result: StepResult) -> None:
        # Smaller first chunks run as a launch of their own ("codec_first") when the engine has one.
        codec = plan.codec
        split = "codec_first" in result.stage_seconds
        first = codec.chunk_index == 0 if split else np.zeros(len(codec), dtype=np.bool_)
        sizes = {"prefill": (len(plan.prefill), plan.prefill.total_tokens), "decode": (len(plan.decode),) * 2,
                 "codec": (int((~first).sum()), int(codec.num_frames[~first].sum())),
                 "codec_first": (int(first.sum()), int(codec.num_frames[first].sum()))}
        for stage, seconds in result.stage_seconds.items():
            rows, tokens = sizes.get(stage, (0, 0))
            self.write({"type": "stage", "step": plan.step_id, "stage": stage, "rows": rows,
                        "tokens": tokens, "device_ms": seconds * 1000, "timer": self.timer})

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_trace(path: str | Path) -> Iterator[dict[str, Any]]:
    """Records of one trace file, or of every `*.jsonl` file in a directory."""
    path = Path(path)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    for file in files:
        with file.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)

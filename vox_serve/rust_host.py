"""What the Rust runtime (`vox_serve._rt.serve`) calls in Python, all off the step path except on CPU.

Start-up: `build_engine_spec` builds the engine of one replica in this interpreter and returns its
spec (JSON); with `--dp-size N` it is called once per replica. Requests: `bench_requests` builds a
bench phase's requests with the program's own prompt builder (`--prompt-builder python`; Qwen3-TTS
Base's reference-audio encoder runs here too) as plain data. After each phase the Rust side hands
its outcomes to `bench_recorder`'s report (bench_report.py).
Launches: on a CPU device a stage's handle is a callable and attention is planned by the
torch backend through the spec's planner handle; `stage_runner` and `attention_planner` resolve
them into functions of plain arguments.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from vox_serve.bench_report import BenchPhase, BenchRecorder, bench_phases
from vox_serve.config import VoxConfig
from vox_serve.core.request import Request, SamplingParams
from vox_serve.core.stages import Stage
from vox_serve.progress import Progress
from vox_serve.request_builder import FieldError


def build_engine_spec(config_json: str, replica: int = 0) -> str:
    """The spec of replica `replica`'s engine, built for this config on its device (engine/placement.py);
    the engine stays registered for the process."""
    from vox_serve.bench import build_engine_shown, set_cpu_threads
    from vox_serve.engine.placement import replica_config

    t0 = time.perf_counter()
    config = replica_config(VoxConfig.from_dict(json.loads(config_json)), replica)
    set_cpu_threads(config)
    program, spec = build_engine_shown(config, Progress())
    print(f"model {program.meta.name} ready in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return json.dumps(spec)


def _request_data(req: Request) -> dict[str, Any]:
    p = req.prompt
    return {
        "req_id": req.req_id, "streaming": req.streaming, "ids": p.ids.tolist(),
        "vectors": [[int(pos), v.astype(np.float32).ravel().tolist()] for pos, v in p.vectors.items()],
        "conditioning": [[name, int(len(v)), v.astype(np.float32).ravel().tolist()]
                         for name, v in p.conditioning.items()],
        "sampling": _sampling(req.sampling), "trailing_text": list(p.trailing_text),
    }


def _sampling(s: SamplingParams) -> dict[str, Any]:
    return dataclasses.asdict(s)


def bench_recorder(engine_id: int, config_json: str) -> BenchRecorder:
    """Bench mode's phases and report (vox_serve/bench_report.py), shared with the Python runtime."""
    from vox_serve.engine.registry import get_engine

    meta = get_engine(engine_id).program.meta
    return BenchRecorder(VoxConfig.from_dict(json.loads(config_json)), meta.name, meta.sample_rate)


def _phase(config: VoxConfig, phase: int) -> BenchPhase:
    return bench_phases(config)[phase]


def bench_requests(engine_id: int, config_json: str, phase: int = 0) -> str:
    """Bench mode's requests of one phase as JSON, prompts built by the program; FieldError names a bad field."""
    from vox_serve.bench import bench_fields, phase_requests
    from vox_serve.engine.registry import get_engine

    config = VoxConfig.from_dict(json.loads(config_json))
    program = get_engine(engine_id).program
    requests = phase_requests(program, bench_fields(config), _phase(config, phase), config.bench.greedy)
    return json.dumps([_request_data(req) for req in requests])


def bench_request_fields(engine_id: int, config_json: str, phase: int = 0) -> str:
    """Bench mode's requests of one phase as validated fields and sampling parameters, for prompts built
    in Rust (JSON; an uploaded file is `true`: only its presence matters there). FieldError names a bad
    field."""
    from vox_serve.bench import bench_fields
    from vox_serve.engine.registry import get_engine
    from vox_serve.request_builder import request_fields

    config = VoxConfig.from_dict(json.loads(config_json))
    meta = get_engine(engine_id).program.meta
    out = []
    p = _phase(config, phase)
    for req_id, seed in zip(p.req_ids, p.seeds, strict=True):
        clean, sampling = request_fields(meta, bench_fields(config), config.bench.greedy, seed)
        out.append({"req_id": req_id, "streaming": clean.get("streaming", True),
                    "fields": {k: True if isinstance(v, bytes | bytearray) else v for k, v in clean.items()},
                    "sampling": _sampling(sampling)})
    return json.dumps(out)


def field_error_message(exc: BaseException) -> str | None:
    """The message of a bad request field or an unreadable --bench-audio (None for any other error)."""
    if isinstance(exc, OSError):
        return f"--bench-audio: {exc}"
    return f"--bench-kwargs/--bench-text: {exc}" if isinstance(exc, FieldError) else None


_STREAMS: list[Any] = []  # the launch streams handed to the Rust runtime stay alive with the process


def launch_stream(device: str, partition_stream: int | None = None, priority: int = 0) -> int:
    """A new CUDA stream of `device` for a replica's launches (its raw handle; `priority`: CUDA's, lower runs
    first); for an engine on an SM partition (`spec.sm_partition`) the partition's own stream, which its graphs
    were captured on."""
    import torch

    from vox_serve.rt.partition import partition_stream as find_partition_stream

    if partition_stream is None:
        stream = torch.cuda.Stream(torch.device(device), priority=priority)
    else:
        found = find_partition_stream(partition_stream)
        if found is None:
            raise ValueError(f"spec.sm_partition.stream {partition_stream:#x} is no SM partition's stream")
        stream = found
    _STREAMS.append(stream)
    return stream.cuda_stream


def _on_stream(stream: int | None) -> Any:
    """A context that makes `stream` torch's current one (per thread: the scheduler thread calls in)."""
    import contextlib

    if stream is None:
        return contextlib.nullcontext()
    import torch

    found = next(s for s in _STREAMS if s.cuda_stream == stream)
    return torch.cuda.stream(found)


def stage_runner(handle: str, stream: int | None = None) -> Callable[[int | None], None]:
    """A callable stage handle as run(num_seqs), on `stream` where given."""
    from vox_serve.engine.registry import resolve_stage

    run_stage = resolve_stage(handle)

    def run(num_seqs: int | None) -> None:
        with _on_stream(stream):
            run_stage(num_seqs)

    return run


def attention_planner(handle: str, stream: int | None = None) -> Callable[..., None]:
    """The spec's planner handle as plan(stage, qo_lens, kv_lens, num_rows, graph_tokens, decode, host_buffer)."""
    from vox_serve.engine.registry import resolve_planner
    from vox_serve.rt.attention.base import AttentionPlan

    plan = resolve_planner(handle)

    def run(stage: str, qo_lens: list[int], kv_lens: list[int], num_rows: int, graph_tokens: int | None,
            decode: bool, host_buffer: int) -> None:
        attention = AttentionPlan(len(qo_lens), np.asarray(qo_lens, dtype=np.int64),
                                  np.asarray(kv_lens, dtype=np.int64), num_rows=num_rows, graph_tokens=graph_tokens,
                                  decode=decode)
        with _on_stream(stream):
            plan(Stage(stage), attention, host_buffer)

    return run

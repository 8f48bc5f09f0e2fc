"""Engines alive in this process, and the handles of their specs resolved back to Python objects.

A spec names a stage launch by a graph-exec handle (CUDA) or, where there is no graph (a CPU
device, `--disable-cuda-graph`, eager prefill), by a callable handle `callable:<engine>:<stage>:<bucket>`;
attention planning by `planner:<engine>`. A runtime in this process resolves them here; the engines
stay registered (and their graphs and buffers alive) until the process ends.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from vox_serve.core.stages import Stage

if TYPE_CHECKING:
    from vox_serve.engine.build import Engine

_ENGINES: dict[int, Engine] = {}
_ids = itertools.count()


def register(build: Callable[[int], Engine]) -> Engine:
    engine_id = next(_ids)
    engine = build(engine_id)
    _ENGINES[engine_id] = engine
    return engine


def get_engine(engine_id: int) -> Engine:
    return _ENGINES[engine_id]


def engine_of(program: object) -> Engine:
    """The engine built around `program`."""
    return next(e for e in _ENGINES.values() if e.program is program)


def callable_handle(engine_id: int, stage: Stage, bucket: int) -> str:
    return f"callable:{engine_id}:{stage}:{bucket}"


def planner_handle(engine_id: int) -> str:
    return f"planner:{engine_id}"


def resolve_stage(handle: str) -> Callable[..., None]:
    """`callable:<engine>:<stage>:<bucket>` -> run(num_seqs=None) of that stage and bucket."""
    kind, engine_id, stage, bucket = handle.split(":")
    if kind != "callable":
        raise ValueError(f"{handle!r} is not a callable stage handle")
    program = _ENGINES[int(engine_id)].program
    stage, bucket = Stage(stage), int(bucket)
    # as at warm-up and capture, whose tensors are inference tensors; one context object per handle, entered
    # once per launch (building one costs more than a small stage's host work; a handle is never re-entered)
    inference = torch.inference_mode()

    def run(num_seqs: int | None = None) -> None:
        with inference:
            program.run_stage(stage, bucket, num_seqs)

    return run


def resolve_planner(handle: str) -> Callable[[Stage, Any, int], None]:
    """`planner:<engine>` -> plan(stage, attention_plan, host_buffer): the engine's attention planner,
    reading the CSR offsets from that host buffer of its step arena."""
    from vox_serve.engine.capture import plan_inputs

    kind, engine_id = handle.split(":")
    if kind != "planner":
        raise ValueError(f"{handle!r} is not a planner handle")
    program = _ENGINES[int(engine_id)].program
    inference = torch.inference_mode()
    inputs: dict[tuple[Stage, int], Any] = {}  # views of fixed buffers: made once per (stage, host buffer)

    def plan(stage: Stage, attention_plan: Any, host_buffer: int) -> None:
        key = (stage, host_buffer)
        if key not in inputs:
            inputs[key] = plan_inputs(program, stage, host_buffer)
        # FlashInfer's wrappers create some buffers at their first plan, at warm-up (inference mode):
        # later plans write them in place, which only inference mode allows
        with inference:
            program.attention.plan(attention_plan, inputs[key])

    return plan

"""Building engines in tests and driving them through their specs, as the Python runtime does."""

from __future__ import annotations

import dataclasses
from typing import Any

from vox_serve.config import VoxConfig
from vox_serve.engine.build import engine_of_program, load_program
from vox_serve.engine.registry import engine_of
from vox_serve.engine.spec import engine_spec
from vox_serve.engine_loop import EngineLoop
from vox_serve.rt.program import Program
from vox_serve.scheduler.factory import make_scheduler
from vox_serve.worker.disagg_worker import DisaggregatedWorker
from vox_serve.worker.engine_worker import EngineWorker


def build_program(config: VoxConfig) -> Program:
    """The program of a freshly built engine for `config` (loaded, sized, captured)."""
    program = load_program(config)
    engine_of_program(program, config, report=False)
    return program


def prepare(program: Program, config: VoxConfig) -> Program:
    """Build the engine around a program loaded by the test itself."""
    engine_of_program(program, config, report=False)
    return program


def spec_of(program: Program) -> dict[str, Any]:
    return engine_spec(engine_of(program))


def engine_worker(program: Program, **options: Any) -> EngineWorker:
    return EngineWorker(spec_of(program), **options)


def make_loop(program: Program, config: VoxConfig, record: bool = True, disaggregated: bool = False,
              **options: Any) -> EngineLoop:
    """The Python runtime's loop over the program's engine (recording outputs by default). `disaggregated`:
    build the program as a disaggregated engine (both halves on its device) instead of `prepare`."""
    if disaggregated:
        config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, enable_disaggregation=True))
        worker = DisaggregatedWorker(engine_of_program(program, config, report=False))
    else:
        worker = engine_worker(program)
    scheduler = make_scheduler(program.meta, program.limits, config.scheduler)
    return EngineLoop(scheduler, worker, record=record, **options)

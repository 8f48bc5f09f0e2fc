"""Time each stage of an engine alone and list the kernels its device time goes to.

    python benchmark/profile_stages.py --model orpheus --load-format dummy --device cuda \
        --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256 [--out DIR]

Takes the server's flags and builds the engine as the server does (KV sized, stages captured). For
every scenario (prefill of short prompts, decode at several batch sizes with a 512-token context,
codec chunks at several batch sizes; `STAGES=codec` or `STAGES=prefill,decode` keeps some, `BATCHES=1,4`
sets the decode batches, `TOP=N` lists N kernels, `OPS=N` the N slowest convolutions and matmuls with their
input shapes) it reports, per launch: the whole step through the spec-driven worker (host write, one upload,
attention planning, launch, one download), the captured graph replayed alone, the stage run eagerly, and
the top kernels of one eager run (torch.profiler). Slots are admitted with synthetic page tables (every row
holds its own pages), so this measures stages, not scheduling.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vox_serve.cli import build_config, check_flags, given_flags  # noqa: E402
from vox_serve.core.plan import CodecLaunch, LmLaunch, PageUpdates, SlotInit, StepPlan  # noqa: E402
from vox_serve.core.stages import Stage, pick_bucket  # noqa: E402
from vox_serve.engine.build import engine_of_program, load_program  # noqa: E402
from vox_serve.engine.registry import engine_of  # noqa: E402
from vox_serve.engine.spec import engine_spec  # noqa: E402
from vox_serve.rt.program import Program  # noqa: E402
from vox_serve.worker.engine_worker import EngineWorker  # noqa: E402

CONTEXT = int(os.environ.get("CONTEXT", 512))  # tokens of each decode row's KV
PREFILL_TOKENS = 32


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def pages_per_slot(program: Program) -> int:
    return -(-(CONTEXT + PREFILL_TOKENS) // program.limits.page_size)


def admission_plans(program: Program, num_slots: int) -> list[StepPlan]:
    """Steps that admit slots 0..num_slots-1, each with its own pages (page 0 is the null page)."""
    lim, per = program.limits, pages_per_slot(program)
    if 1 + num_slots * per > lim.num_pages:
        raise SystemExit(f"{num_slots} rows of {CONTEXT + PREFILL_TOKENS} tokens need {num_slots * per} KV pages; "
                         f"the cache has {lim.num_pages - 1} (raise --gpu-memory-utilization or lower batches)")
    per_step = max(1, min(lim.max_admits, lim.max_page_updates // per))
    d = program.meta.default_sampling  # the model's own defaults (Qwen3-TTS: top-k 50, no top-p; Orpheus: top-p 0.8)
    sampling = dict(temperature=float(d.get("temperature", 1.0)), top_k=int(d.get("top_k", 0)),
                    top_p=float(d.get("top_p", 1.0)), min_p=float(d.get("min_p", 0.0)),
                    repetition_penalty=float(d.get("repetition_penalty", 1.0)))
    plans = []
    for first in range(0, num_slots, per_step):
        slots = np.arange(first, min(first + per_step, num_slots), dtype=np.int32)
        admits = [SlotInit(slot=int(s), prompt_len=PREFILL_TOKENS, **sampling,
                           repetition_window=min(64, lim.repetition_window), seed=int(s), allow_stop=False)
                  for s in slots]
        slot_col = np.repeat(slots, per)
        index = np.tile(np.arange(per, dtype=np.int32), len(slots))
        pages = PageUpdates(slot_col, index, (1 + slot_col * per + index).astype(np.int32))
        plans.append(StepPlan(len(plans) + 1, admits=admits, pages=pages))
    return plans


def lm_launch(program: Program, n: int, tokens: int, start: int) -> LmLaunch:
    columns = program.meta.input_columns
    return LmLaunch(req_ids=[f"r{i}" for i in range(n)], slot=np.arange(n, dtype=np.int32),
                    start=np.full(n, start, dtype=np.int32), num_tokens=np.full(n, tokens, dtype=np.int32),
                    sample=np.ones(n, dtype=np.bool_), input_ids=np.zeros((n * tokens, columns), dtype=np.int32))


def codec_launch(program: Program, n: int) -> CodecLaunch:
    frames = program.limits.frames_per_chunk
    window = program.meta.codec_window(frames)
    full = np.full(n, 1, dtype=np.int32)
    return CodecLaunch(req_ids=[f"r{i}" for i in range(n)], slot=np.arange(n, dtype=np.int32), chunk_index=full,
                       first_frame=np.zeros(n, dtype=np.int32), window_end=np.full(n, window, dtype=np.int32),
                       num_frames=np.full(n, frames, dtype=np.int32), is_last=np.zeros(n, dtype=np.bool_))


def per_launch_ms(run: Callable[[], None], repeats: int) -> float:
    run()  # warm
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    sync()
    return (time.perf_counter() - start) / repeats * 1000


def kernels(run: Callable[[], None], top: int) -> list[dict]:
    on_gpu = torch.cuda.is_available()
    activity = torch.profiler.ProfilerActivity.CUDA if on_gpu else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        run()
        sync()
    time_of = (lambda e: e.device_time_total) if on_gpu else (lambda e: e.self_cpu_time_total)
    events = sorted((e for e in prof.key_averages() if time_of(e) > 0), key=time_of, reverse=True)
    total = sum(time_of(e) for e in events)
    print(f"    device total {total / 1000:.3f} ms in {sum(e.count for e in events)} kernels")
    out = []
    for e in events[:top]:
        out.append({"name": e.key[:300], "count": e.count, "ms": time_of(e) / 1000})
        print(f"    {time_of(e) / 1000:8.3f} ms  x{e.count:<5d} {e.key[:100]}")
    ops = int(os.environ.get("OPS", "0"))
    if ops and on_gpu:
        op_shapes(run, ops)
    return out


def op_shapes(run: Callable[[], None], top: int) -> None:
    """The `top` convolution and matmul calls by device time, with their input shapes (`OPS=N`): which layer a
    slow kernel belongs to."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        run()
        sync()
    wanted = ("aten::convolution", "aten::mm", "aten::bmm", "aten::matmul", "aten::addmm")
    events = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in wanted and e.device_time_total > 0]
    for e in sorted(events, key=lambda e: e.device_time_total, reverse=True)[:top]:
        print(f"    op {e.device_time_total / 1000:8.3f} ms  x{e.count:<4d} {e.key} {str(e.input_shapes)[:160]}")


def scenario_plan(program: Program, stage: Stage, n: int) -> StepPlan:
    plan = StepPlan(1000)
    if stage is Stage.PREFILL:
        plan.prefill = lm_launch(program, n, PREFILL_TOKENS, 0)
    elif stage is Stage.DECODE:
        plan.decode = lm_launch(program, n, 1, CONTEXT)
    else:
        plan.codec = codec_launch(program, n)
    return plan


def measure(program: Program, worker: EngineWorker, stage: Stage, n: int, top: int) -> dict:
    plan = scenario_plan(program, stage, n)
    entry = {"stage": str(stage), "rows": n, "step_ms": per_launch_ms(lambda: worker.execute(plan), 20)}
    bucket = pick_bucket(n * PREFILL_TOKENS if stage is Stage.PREFILL else n, worker.buckets[stage])
    handle = worker.launchers[(stage, bucket)]
    if isinstance(handle, int):  # the captured graph alone, over the inputs the last step uploaded
        entry["graph_ms"] = per_launch_ms(lambda: worker.cuda.launch(handle, worker.stream), 50)
    seqs = n if stage is Stage.PREFILL and not isinstance(handle, int) else None

    def eager() -> None:
        with torch.inference_mode():  # as the stage handles run it (its tensors are inference tensors)
            program.run_stage(stage, bucket, seqs)

    entry["eager_ms"] = per_launch_ms(eager, 5)
    shown = " ".join(f"{k} {v:.3f} ms" for k, v in entry.items() if k.endswith("_ms"))
    print(f"{stage} x{n} (bucket {bucket}): {shown} per launch")
    entry["kernels"] = kernels(eager, top)
    return entry


def main() -> None:
    argv = sys.argv[1:]
    out_dir = None
    if "--out" in argv:
        i = argv.index("--out")
        out_dir = Path(argv[i + 1])
        del argv[i: i + 2]
    config = build_config(check_flags(given_flags(argv), "python", rust_missing=False)[0], "python")
    program = load_program(config)
    engine_of_program(program, config)
    worker = EngineWorker(engine_spec(engine_of(program)))
    lim = program.limits
    largest = max(lim.max_batch, lim.max_codec_batch)
    for plan in admission_plans(program, largest):
        worker.execute(plan)
    scenarios = [(Stage.PREFILL, n) for n in (1, 4) if n <= lim.max_prefill_seqs]
    decode_rows = [int(n) for n in os.environ.get("BATCHES", "1,16,64,128,256").split(",")]  # e.g. BATCHES=1,4
    scenarios += [(Stage.DECODE, n) for n in decode_rows if n <= lim.max_batch]
    scenarios += [(Stage.CODEC, n) for n in (1, 16, 64, 128, 256) if n <= lim.max_codec_batch]
    wanted = os.environ.get("STAGES")  # e.g. STAGES=codec: only those stages' scenarios
    if wanted:
        scenarios = [(stage, n) for stage, n in scenarios if str(stage) in wanted.split(",")]
    top = int(os.environ.get("TOP", "12"))
    report = [measure(program, worker, stage, n, top) for stage, n in scenarios]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "stages.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""Time each stage of a program alone and list the kernels its device time goes to.

    python benchmark/profile_stages.py --model orpheus --load-format dummy --device cuda \
        --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256 [--out DIR]

Takes the server's flags. For every scenario (prefill of a short prompt, decode at several batch
sizes with a 512-token context, codec at several batch sizes) it reports the mean wall time of a
launch, graph replay and eager, and the top kernels of one eager launch from torch.profiler.
Rows are synthetic (every sequence holds its own pages), so this measures stages, not scheduling.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vox_serve.cli import build_config, check_flags, given_flags  # noqa: E402
from vox_serve.core.plan import CodecRow, LmRow, StepPlan  # noqa: E402
from vox_serve.engine.build import build_program  # noqa: E402
from vox_serve.worker.program_worker import ProgramWorker  # noqa: E402

CONTEXT = 512


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def lm_rows(program, n: int, tokens: int, context: int) -> list[LmRow]:
    lim, meta = program.limits, program.meta
    pages_per_seq = -(-(context + tokens) // lim.page_size)
    rows = []
    for i in range(n):
        first = 1 + i * pages_per_seq  # page 0 is the null page
        pages = list(range(first, first + pages_per_seq))
        ids = [[0] * meta.input_columns for _ in range(tokens)]
        rows.append(LmRow(f"r{i}", ids, context, pages, True, 0.6, 0, 0.8, 0.0, 1.3,
                          list(range(min(64, lim.repetition_window))), 100, 100, False, i))
    return rows


def codec_rows(program, n: int) -> list[CodecRow]:
    meta, lim = program.meta, program.limits
    window = meta.codec_window(lim.frames_per_chunk)
    frames = [[7] * meta.codes_per_frame for _ in range(window)]
    return [CodecRow(f"r{i}", 5, frames, lim.frames_per_chunk, 5, i, i if meta.stateful_codec else 0)
            for i in range(n)]


def timed(worker: ProgramWorker, plan: StepPlan, repeats: int) -> float:
    worker.execute(plan)  # warm
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        worker.execute(plan)
    sync()
    return (time.perf_counter() - start) / repeats * 1000


def kernels(worker: ProgramWorker, plan: StepPlan, top: int) -> list[dict]:
    on_gpu = torch.cuda.is_available()
    activity = torch.profiler.ProfilerActivity.CUDA if on_gpu else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        worker.execute(plan)
        sync()
    time_of = (lambda e: e.device_time_total) if on_gpu else (lambda e: e.self_cpu_time_total)
    events = [e for e in prof.key_averages() if time_of(e) > 0]
    events.sort(key=time_of, reverse=True)
    total = sum(time_of(e) for e in events)
    print(f"    device total {total / 1000:.3f} ms in {sum(e.count for e in events)} kernels")
    out = []
    for e in events[:top]:
        out.append({"name": e.key[:90], "count": e.count, "ms": time_of(e) / 1000})
        print(f"    {time_of(e) / 1000:8.3f} ms  x{e.count:<5d} {e.key[:100]}")
    return out


def main() -> None:
    argv = sys.argv[1:]
    out_dir = None
    if "--out" in argv:
        i = argv.index("--out")
        out_dir = Path(argv[i + 1])
        del argv[i : i + 2]
    config = build_config(check_flags(given_flags(argv), "python", rust_missing=False)[0], "python")
    program = build_program(config)
    graphs = ProgramWorker(program, use_cuda_graphs=True)
    eager = ProgramWorker(program, use_cuda_graphs=False)
    lim = program.limits
    scenarios = [("prefill", 1, 32), ("prefill", 8, 32)]
    scenarios += [("decode", n, 1) for n in (1, 8, 64, 128, 256) if n <= lim.max_batch]
    scenarios += [("codec", n, 0) for n in (1, 16, 64, 128, 256) if n <= lim.max_codec_batch]
    report = []
    for stage, n, tokens in scenarios:
        plan = StepPlan(1)
        if stage == "codec":
            plan.codec = codec_rows(program, n)
        elif stage == "prefill":
            plan.prefill = lm_rows(program, n, tokens, 0)
        else:
            plan.decode = lm_rows(program, n, tokens, CONTEXT)
        entry = {"stage": stage, "rows": n, "graph_ms": timed(graphs, plan, 20), "eager_ms": timed(eager, plan, 5)}
        print(f"{stage} x{n}: graph {entry['graph_ms']:.3f} ms, eager {entry['eager_ms']:.3f} ms per launch")
        entry["kernels"] = kernels(eager, plan, int(os.environ.get("TOP", "12")))
        report.append(entry)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "stages.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""Compare scheduling policies on the simulated engine (CPU, seconds per run).

    python benchmark/simulate.py --model orpheus --scheduler-type all --rates 1,2,4,8,16

For each policy and Poisson rate: TTFA p90/p95 and viability of streaming requests, underruns
(late chunks) and throughput (audio seconds per second); `--batch-job N` adds a table of N
non-streaming requests sent at once. Cost profiles live in benchmark/profiles; calibrate one
from a GPU run's `--trace-dir` with `--calibrate TRACE_DIR --write-profile PATH`.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vox_serve.scheduler.factory import POLICIES  # noqa: E402
from vox_serve.sim.calibrate import profile_from_trace  # noqa: E402
from vox_serve.sim.cost import load_profile  # noqa: E402
from vox_serve.sim.driver import EngineOptions, SimRun, simulate  # noqa: E402
from vox_serve.sim.workload import WorkloadSpec, poisson_workload  # noqa: E402
from vox_serve.trace import read_trace  # noqa: E402

ALL = ("base", "online", "offline", "deadline")


def _pair(text: str, kind: type) -> tuple:
    lo, hi = (kind(v) for v in text.split(","))
    return lo, hi


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="orpheus", help="profile name in benchmark/profiles, or a JSON path")
    p.add_argument("--scheduler-type", default="all", help="a policy, a comma list, or all")
    p.add_argument("--rates", default="1,2,4,8,16", help="Poisson request rates (requests/s), comma separated")
    p.add_argument("--num-requests", type=int, default=400, help="requests per rate")
    p.add_argument("--audio-seconds", default="3,8", help="answer length range, uniform (seconds)")
    p.add_argument("--prompt-tokens", default="20,80", help="prompt length range, uniform")
    p.add_argument("--streaming-fraction", type=float, default=1.0, help="share of streaming requests")
    p.add_argument("--batch-job", type=int, default=0, help="also run N non-streaming requests sent at once")
    p.add_argument("--max-batch-size", type=int, default=256)
    p.add_argument("--max-codec-batch", type=int, default=128)
    p.add_argument("--max-prefill-tokens", type=int, default=2048)
    p.add_argument("--max-num-pages", type=int, default=None)
    p.add_argument("--detokenize-interval", type=int, default=None, help="frames per chunk (default: model's)")
    p.add_argument("--async-scheduling", action="store_true")
    p.add_argument("--deadline-startup-ms", type=float, default=None)
    p.add_argument("--deadline-max-prefill-deferral-ms", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="simulations run in parallel processes")
    p.add_argument("--trace-dir", default=None, help="write each run's scheduling trace under this directory")
    p.add_argument("--markdown", action="store_true", help="print Markdown tables")
    p.add_argument("--calibrate", default=None, metavar="TRACE_DIR", help="fit a profile from a trace and exit")
    p.add_argument("--write-profile", default=None, metavar="PATH", help="where --calibrate writes its profile")
    p.add_argument("--device", default="", help="device name recorded in a calibrated profile")
    return p.parse_args(argv)


def _policies(text: str) -> list[str]:
    names = list(ALL) if text == "all" else text.split(",")
    for name in names:
        if name not in POLICIES:
            raise SystemExit(f"unknown --scheduler-type {name!r} (known: {', '.join(POLICIES)}, all)")
    return names


def _run(job: tuple) -> tuple[str, float, SimRun]:
    args, policy, rate, streaming_fraction, num = job
    profile = load_profile(args.model)
    frame_s = profile.meta.samples_per_frame / profile.meta.sample_rate
    spec = WorkloadSpec(rate, num, _pair(args.audio_seconds, float), _pair(args.prompt_tokens, int),
                        streaming_fraction, args.seed)
    engine = EngineOptions(max_batch=args.max_batch_size, max_codec_batch=args.max_codec_batch,
                           max_prefill_tokens=args.max_prefill_tokens, num_pages=args.max_num_pages,
                           frames_per_chunk=args.detokenize_interval)
    trace_dir = f"{args.trace_dir}/{policy}-{rate:g}" if args.trace_dir else None
    run = simulate(profile, policy, poisson_workload(spec, frame_s), engine, trace_dir=trace_dir,
                   check_pages=False, async_scheduling=args.async_scheduling,
                   deadline_startup_ms=args.deadline_startup_ms,
                   deadline_max_prefill_deferral_ms=args.deadline_max_prefill_deferral_ms)
    return policy, rate, run


def _table(rows: list[list[str]], header: list[str], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*header)] + [fmt.format(*r) for r in rows])


def stream_row(policy: str, rate: float, run: SimRun) -> list[str]:
    s = run.summary
    return [policy, f"{rate:g}", f"{s.ttfa_p90 * 1000:.0f}", f"{s.ttfa_p95 * 1000:.0f}", f"{s.viability:.1f}",
            f"{s.all_chunks:.1f}", str(s.underruns), f"{s.throughput:.1f}", f"{s.num_completed}/{s.num_requests}",
            f"{run.wall_seconds:.1f}"]


def batch_row(policy: str, run: SimRun) -> list[str]:
    s = run.summary
    launches = run.stats.codec_launches
    return [policy, str(s.num_requests), f"{s.duration:.2f}", f"{s.throughput:.1f}", f"{s.latency_p90:.2f}",
            str(launches), f"{run.stats.codec_rows / max(launches, 1):.1f}"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.calibrate:
        base = load_profile(args.model).raw
        profile = profile_from_trace(read_trace(args.calibrate), Path(args.write_profile or "calibrated").stem,
                                     args.device, base)
        text = json.dumps(profile, indent=2) + "\n"
        if args.write_profile:
            Path(args.write_profile).write_text(text)
        print(text)
        return 0
    policies = _policies(args.scheduler_type)
    rates = [float(r) for r in args.rates.split(",")]
    jobs = [(args, p, r, args.streaming_fraction, args.num_requests) for r in rates for p in policies]
    jobs += [(args, p, 0.0, 0.0, args.batch_job) for p in policies if args.batch_job]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_run, jobs)) if args.jobs > 1 else [_run(j) for j in jobs]
    profile = load_profile(args.model)
    print(f"profile {profile.name} ({profile.raw.get('device', '')}); max batch {args.max_batch_size}, "
          f"codec batch {args.max_codec_batch}, {args.num_requests} requests a rate, answers "
          f"{args.audio_seconds} s{', async scheduling' if args.async_scheduling else ''}\n")
    streams = [stream_row(p, r, run) for p, r, run in results[: len(rates) * len(policies)]]
    print(_table(streams, ["policy", "rate/s", "TTFA p90 ms", "TTFA p95 ms", "viability %", "all-chunks %",
                           "underruns", "audio s/s", "done", "sim wall s"], args.markdown))
    if args.batch_job:
        batch = [batch_row(p, run) for p, _, run in results[len(rates) * len(policies):]]
        print(f"\nbatch job: {args.batch_job} non-streaming requests sent at once\n")
        print(_table(batch, ["policy", "requests", "makespan s", "audio s/s", "latency p90 s", "codec launches",
                             "chunks/launch"], args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())

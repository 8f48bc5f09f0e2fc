"""Where a run's time went, from its `--trace-dir`: device time per stage against wall time per step.

    python benchmark/trace_summary.py TRACE_DIR [--json OUT.json]

Per stage: launches, mean rows, mean and total device milliseconds. Per run: steps, wall seconds
between the first and the last planned step, wall milliseconds per step, device milliseconds per
step (all stages), and the difference, the host time per step that the device did not hide
(planning, arena filling, attention planning, copies, result handling). Device times come from
CUDA events on a GPU; on a CPU they are wall times of the stage calls.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vox_serve.trace import read_trace  # noqa: E402

# Stages of the codec: with `--overlap-detok` they run on their own stream, beside the LM's, so the device
# time per step counts time that the wall clock may not see twice.
CODEC_STAGES = frozenset({"codec", "codec_first", "codec_prime", "codec_prologue"})


def summarize(records: list[dict]) -> dict:
    steps = [r for r in records if r["type"] == "schedule"]
    stages = [r for r in records if r["type"] == "stage"]
    per_stage: dict[str, list[dict]] = defaultdict(list)
    for r in stages:
        per_stage[r["stage"]].append(r)
    out: dict = {"steps": len(steps), "stages": {}}
    for name, recs in sorted(per_stage.items()):
        total = sum(r["device_ms"] for r in recs)
        out["stages"][name] = {"launches": len(recs), "mean_rows": sum(r["rows"] for r in recs) / len(recs),
                               "mean_ms": total / len(recs), "total_ms": total}
    if len(steps) >= 2:
        wall_ms = (steps[-1]["t"] - steps[0]["t"]) * 1000
        device_ms = sum(r["device_ms"] for r in stages if r["step"] < steps[-1]["step"])
        codec_ms = sum(r["device_ms"] for r in stages if r["step"] < steps[-1]["step"] and r["stage"] in CODEC_STAGES)
        n = len(steps) - 1
        out.update(wall_s=wall_ms / 1000, wall_ms_per_step=wall_ms / n, device_ms_per_step=device_ms / n,
                   codec_ms_per_step=codec_ms / n,
                   host_ms_per_step=(wall_ms - device_ms) / n,
                   plan_ms_per_step=sum(s["plan_ms"] for s in steps) / len(steps))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace_dir")
    p.add_argument("--json", default=None, help="also write the summary here")
    args = p.parse_args()
    summary = summarize(list(read_trace(args.trace_dir)))
    for name, s in summary["stages"].items():
        print(f"{name:8s} launches {s['launches']:6d}  mean rows {s['mean_rows']:7.1f}  "
              f"mean {s['mean_ms']:8.3f} ms  total {s['total_ms'] / 1000:8.2f} s")
    if "wall_ms_per_step" in summary:
        print(f"steps {summary['steps']}  wall {summary['wall_s']:.2f} s  per step: wall "
              f"{summary['wall_ms_per_step']:.3f} ms, device {summary['device_ms_per_step']:.3f} ms "
              f"(codec {summary['codec_ms_per_step']:.3f} ms, on its own stream with --overlap-detok), "
              f"host not hidden {summary['host_ms_per_step']:.3f} ms (planning {summary['plan_ms_per_step']:.3f} ms)")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

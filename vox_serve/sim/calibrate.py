"""Fit a cost profile from `--trace-dir` output of a real run (pure Python).

Stage records give device time per launch: the median at each batch size (decode, codec) or
prompt-token count (prefill, grouped into powers of two) becomes a point of that stage's curve.
Decisions give host time: a least-squares line of planning time over rows in the step. The
model's meta comes from the trace header, so the profile is self-contained.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

STAGE_X = {"decode": "rows", "codec": "rows", "prefill": "tokens"}


def _bucket(x: int) -> int:
    """The power of two at or above x (prefill token counts vary too much to keep each)."""
    b = 1
    while b < x:
        b *= 2
    return b


def _curve(samples: dict[int, list[float]]) -> list[list[float]]:
    return [[x, round(statistics.median(ys), 4)] for x, ys in sorted(samples.items())]


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y over x; slope 0 when x never varies."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / var if var else 0.0
    return mean_y - slope * mean_x, slope


def profile_from_trace(records: Iterable[dict[str, Any]], name: str, device: str = "",
                       base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A profile dict from trace records; stages the trace never ran keep `base`'s curves."""
    stages: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    host: list[tuple[float, float]] = []
    meta = None
    for rec in records:
        kind = rec.get("type")
        if kind == "header":
            meta = rec["meta"]
        elif kind == "stage" and rec["stage"] in STAGE_X:
            x = int(rec[STAGE_X[rec["stage"]]])
            if rec["stage"] == "prefill":
                x = _bucket(x)
            stages[rec["stage"]][x].append(float(rec["device_ms"]))
        elif kind == "schedule":
            rows = len(rec["codec"]) + len(rec["prefill"]) + len(rec["decode"])
            host.append((rows, float(rec["plan_ms"])))
    base = base or {}
    if meta is None and "meta" not in base:
        raise ValueError("the trace has no header record and no base profile gives the model's meta")
    costs = dict(base.get("costs", {}))
    for stage in STAGE_X:
        if stages.get(stage):
            costs[f"{stage}_ms"] = _curve(stages[stage])
    if stages.get("decode"):
        costs["decode_kv_ms_per_1k"] = 0.0  # the measured medians include the traced KV lengths
    if host:
        intercept, slope = _line(host)
        costs["host_ms"] = {"per_step": round(max(intercept, 0.0), 4), "per_row": round(max(slope, 0.0), 5)}
    missing = [k for k in ("decode_ms", "prefill_ms", "codec_ms") if k not in costs]
    if missing:
        raise ValueError(f"the trace has no {', '.join(missing)} launches and no base profile gives them")
    counts = {stage: sum(len(v) for v in samples.values()) for stage, samples in stages.items()}
    return {
        "name": name, "model": (meta or base["meta"])["name"], "device": device,
        "source": f"calibrated from a --trace-dir run ({counts} launches, {len(host)} decisions)",
        "notes": ["device times are medians per batch size (prefill: per power-of-two token count)",
                  "host_ms fits the scheduler's planning time; the worker's arena filling is not traced"],
        "meta": meta or base["meta"], "costs": costs,
    }

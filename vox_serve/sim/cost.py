"""Cost profiles: a model's geometry and the time of each stage, loaded from JSON.

A profile (benchmark/profiles/*.json) holds:
- `meta`: the program meta of the model (chunk geometry, sample rate, ...);
- `costs`: piecewise-linear curves `[[x, ms], ...]` of each stage launch -- `decode_ms` over
  batch rows, `prefill_ms` over prompt tokens in the launch, `codec_ms` over chunks -- plus
  `decode_kv_ms_per_1k` (decode attention: ms per 1000 KV tokens over the batch) and host time
  per step (`host_ms.per_step`, `host_ms.per_row`: the Python scheduler and arena filling, which
  asynchronous scheduling overlaps with the device);
- free-text `device`, `source` and `notes` saying where the figures come from.
Below the first point a curve stays flat (no launch is cheaper than the smallest); beyond the last
it extends its last segment.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vox_serve.core.meta import EngineLimits, ProgramMeta
from vox_serve.core.plan import StepPlan

PROFILE_DIR = Path(__file__).resolve().parents[2] / "benchmark" / "profiles"


@dataclass(frozen=True)
class Curve:
    points: tuple[tuple[float, float], ...]

    @classmethod
    def of(cls, points: list[list[float]]) -> Curve:
        pts = tuple(sorted((float(x), float(y)) for x, y in points))
        if not pts:
            raise ValueError("a cost curve needs at least one point")
        return cls(pts)

    def __call__(self, x: float) -> float:
        pts = self.points
        if len(pts) == 1 or x <= pts[0][0]:
            return pts[0][1]
        i = min(bisect.bisect_left([p[0] for p in pts], x), len(pts) - 1)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


@dataclass(frozen=True)
class CostModel:
    decode_ms: Curve
    prefill_ms: Curve
    codec_ms: Curve
    decode_kv_ms_per_1k: float = 0.0
    host_ms_per_step: float = 0.0
    host_ms_per_row: float = 0.0

    @classmethod
    def from_dict(cls, costs: dict[str, Any]) -> CostModel:
        host = costs.get("host_ms", {})
        return cls(Curve.of(costs["decode_ms"]), Curve.of(costs["prefill_ms"]), Curve.of(costs["codec_ms"]),
                   float(costs.get("decode_kv_ms_per_1k", 0.0)), float(host.get("per_step", 0.0)),
                   float(host.get("per_row", 0.0)))

    def stage_seconds(self, plan: StepPlan) -> dict[str, float]:
        """Device seconds of each stage the plan launches."""
        out = {}
        if plan.codec:
            out["codec"] = self.codec_ms(len(plan.codec)) / 1000
        if plan.prefill:
            out["prefill"] = self.prefill_ms(plan.prefill.total_tokens) / 1000
        if plan.decode:
            kv = int(plan.decode.kv_len.sum())
            out["decode"] = (self.decode_ms(len(plan.decode)) + self.decode_kv_ms_per_1k * kv / 1000) / 1000
        return out

    def host_seconds(self, plan: StepPlan) -> float:
        rows = len(plan.codec or ()) + plan.num_lm_rows
        return (self.host_ms_per_step + self.host_ms_per_row * rows) / 1000

    def deadline_estimates(self, limits: EngineLimits) -> dict[str, float]:
        """`--deadline-*-ms` estimates for a full engine: a decode step at the batch limit (with a
        typical KV of 512 tokens a row, and the host time a synchronous step adds), a codec launch of
        half the codec batch and a prefill of a quarter of the token budget."""
        batch = limits.max_batch
        step = self.decode_ms(batch) + self.decode_kv_ms_per_1k * batch * 0.512
        step += self.host_ms_per_step + self.host_ms_per_row * batch
        return {"deadline_lm_step_ms": round(step, 3),
                "deadline_codec_ms": round(self.codec_ms(max(limits.max_codec_batch // 2, 1)), 3),
                "deadline_prefill_ms": round(self.prefill_ms(max(limits.max_prefill_tokens // 4, 1)), 3)}


@dataclass(frozen=True)
class Profile:
    name: str
    meta: ProgramMeta
    costs: CostModel
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        meta = ProgramMeta.from_dict(data["meta"])
        return cls(data.get("name", meta.name), meta, CostModel.from_dict(data["costs"]), data)

    def with_meta(self, **changes: Any) -> Profile:
        """The same profile with some meta fields changed (e.g. a stateful codec)."""
        meta = dataclasses.replace(self.meta, **changes)
        raw = dict(self.raw, meta=dataclasses.asdict(meta)) if self.raw else {}
        return Profile(self.name, meta, self.costs, raw)


def load_profile(name_or_path: str) -> Profile:
    """A profile by path, or by name in benchmark/profiles (`orpheus` -> orpheus-h200.json once
    measured, else orpheus-default.json)."""
    path = Path(name_or_path)
    if not path.suffix:
        candidates = [PROFILE_DIR / f"{name_or_path}-h200.json", PROFILE_DIR / f"{name_or_path}-default.json",
                      PROFILE_DIR / f"{name_or_path}.json"]
        path = next((p for p in candidates if p.exists()), candidates[-1])
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.json")))
        raise FileNotFoundError(f"no cost profile {name_or_path!r} (known: {known})")
    return Profile.from_dict(json.loads(path.read_text()))

"""Measure rt/fp8_gemm's Triton float8 GEMM against cuBLASLt's (`torch._scaled_mm`, what `--quantization fp8` runs
where rt/small_gemm's kernels do not) per decoder projection and rows bucket on this GPU, and write the table of
configurations that won (`--table`: the JSON that `VOX_FP8_GEMM_TABLE` reads, and that
vox_serve/rt/fp8_gemm_tables/<gpu model>.json holds for the GPUs it was measured on).

    python benchmark/fp8_gemm.py --out results.json --table table.json [--rows 32,64,128,256] [--models orpheus,qwen3]

Both sides take the rows already quantized (the kernel before a projection stores them so) and write bfloat16.
Each time is a CUDA-graph replay of launches cycling over enough weight copies that they come from HBM, not the
L2 (benchmark/small_gemm.py's `graph_us`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from small_gemm import MODELS, graph_us, weight_copies  # noqa: E402

from vox_serve.rt import fp8_gemm, small_gemm  # noqa: E402
from vox_serve.rt.fp8_gemm import GemmConfig  # noqa: E402
from vox_serve.rt.small_gemm import Kind  # noqa: E402

CONFIGS = [GemmConfig(64, 64, 128), GemmConfig(64, 128, 128), GemmConfig(64, 128, 128, stages=3),
           GemmConfig(64, 64, 256, stages=3), GemmConfig(64, 128, 256, stages=3), GemmConfig(64, 256, 128, 8, 3),
           GemmConfig(64, 32, 256), GemmConfig(128, 64, 128), GemmConfig(128, 128, 128, 8, 3),
           GemmConfig(128, 128, 128), GemmConfig(128, 256, 128, 8, 3), GemmConfig(128, 128, 256, 8, 3),
           # a few rows (2-32): 16-row tiles (float16 MMAs over the converted float8, bandwidth-bound there)
           GemmConfig(16, 32, 256), GemmConfig(16, 64, 256), GemmConfig(16, 64, 512, stages=3),
           GemmConfig(16, 128, 256), GemmConfig(32, 64, 256)]
HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}
FP8_FLOPS = 1.979e15  # Hopper's dense float8 tensor-core peak (SXM)


def gemm_shapes(models: list[str]) -> list[tuple[str, int, int]]:
    """(name, N, K) of the decoder projections' GEMMs (depth transformers' too): the gated kind's weight holds gate
    and up (2N rows); the gated-input kind is the down projection's GEMM again."""
    names: dict[tuple[int, int], str] = {}  # (N, K) -> the first projection of that shape
    for model in models:
        for s in MODELS[model]:
            n = 2 * s.n if s.kind is Kind.GATED else s.n
            if s.kind is not Kind.GATED_IN and n % 16 == 0 and s.k % 16 == 0:
                names.setdefault((n, s.k), f"{s.model}.{s.name}")
    return [(name, n, k) for (n, k), name in names.items()]


def measure(name: str, n: int, k: int, m: int) -> dict:
    copies = weight_copies(n * k)  # float8: a byte per element
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [fp8_gemm.quantize_weight(torch.randn(n, k, device="cuda", generator=gen) / 32) for _ in range(copies)]
    scales = {id(wq): scale for wq, scale in weights}
    xq, x_scale = fp8_gemm.quantize_rows(torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16))

    def run(wq: torch.Tensor) -> torch.Tensor:
        return fp8_gemm.scaled_mm(xq, x_scale, wq, scales[id(wq)], None, torch.bfloat16)

    wqs = [wq for wq, _ in weights]
    fp8_gemm.forced = lambda *_: None  # cuBLASLt
    try:
        base, ref = graph_us(run, wqs), run(wqs[0]).float()
    finally:
        fp8_gemm.forced = None
    tried = []
    for config in CONFIGS:
        if config.block_m > max(64, small_gemm.rows_bucket(m)) or config.block_m < min(64, small_gemm.rows_bucket(m)):
            continue  # tiles taller than the rows bucket (from 64 rows up) or shorter than it (below 64)
        fp8_gemm.forced = lambda *_, c=config: c
        try:
            err = ((run(wqs[0]).float() - ref).abs().max() / ref.abs().max()).item()
            tried.append({"config": config.as_list(), "us": graph_us(run, wqs), "err": err})
        finally:
            fp8_gemm.forced = None
    best = min(tried, key=lambda t: t["us"])
    card = next((c for c in HBM_BYTES_PER_S if c in torch.cuda.get_device_name()), "H100")
    floor = max(n * k / HBM_BYTES_PER_S[card], 2 * m * n * k / FP8_FLOPS) * 1e6
    return {"name": name, "n": n, "k": k, "rows": m, "cublas_us": base, "best": best, "speedup": base / best["us"],
            "floor_us": floor, "tried": tried}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="every measurement (JSON)")
    p.add_argument("--table", type=Path, required=True, help="the winning configurations (JSON)")
    p.add_argument("--rows", default="32,64,128,256")
    p.add_argument("--models", default="orpheus,qwen3")
    p.add_argument("--min-speedup", type=float, default=1.03, help="an entry needs this ratio over cuBLASLt")
    args = p.parse_args()
    results, entries = [], []
    device = torch.cuda.get_device_name()
    for name, n, k in gemm_shapes(args.models.split(",")):
        for m in (int(r) for r in args.rows.split(",")):
            r = measure(name, n, k, m)
            results.append(r)
            print(f"{name:24s} N={n:5d} K={k:5d} m={m:3d}: cuBLASLt {r['cublas_us']:7.2f} us, Triton "
                  f"{r['best']['us']:7.2f} us {r['best']['config']} (x{r['speedup']:.2f}, floor {r['floor_us']:.2f} us,"
                  f" err {r['best']['err']:.1e})", flush=True)
            if r["speedup"] >= args.min_speedup and r["best"]["err"] < 2e-2:
                entries.append({"rows": small_gemm.rows_bucket(m), "n": n, "k": k, "config": r["best"]["config"]})
        # written after every shape, so a sweep stopped by a time limit keeps what it measured
        args.out.write_text(json.dumps({"device": device, "results": results}, indent=1))
        args.table.write_text(json.dumps({"device": device, "made_by": "benchmark/fp8_gemm.py", "entries": entries},
                                         indent=1))
    print(f"{len(entries)} entries of {len(results)} shapes x rows -> {args.table} "
          f"(default path for this GPU: {small_gemm.table_path(device, fp8_gemm.TABLES_DIR)})")


if __name__ == "__main__":
    main()

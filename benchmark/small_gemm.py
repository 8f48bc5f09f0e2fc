"""Measure `rt.small_gemm`'s kernels against the unfused ops they replace, per shape and rows bucket, on this GPU,
and write the table of configurations that won (`--table`: the JSON that `VOX_SMALL_GEMM_TABLE` reads, and
that vox_serve/rt/small_gemm_tables/<gpu model>.json holds for the GPUs it was measured on).

    python benchmark/small_gemm.py --out results.json --table table.json [--rows 1,2,4,8,16] \
        [--models orpheus,qwen3,csm] [--weights fp8]

Compiling the candidates is most of the time: `--compile-jobs N` compiles them first in N processes, and leaves
out (and records) a configuration that crashes Triton's compiler.

Each time is a CUDA-graph replay of launches cycling over enough copies of the weight that they come from HBM,
not the L2 (as in a model, where every layer's weights differ); the unfused side is what the decoder layers run
without the table: `add_rms_norm` + cuBLAS (+ `silu_mul`); for the gated-input kind (the down projection with
the gate of an unfused gate/up projection), `silu_mul` + the down projection as the table runs it without that
kind (the plain kind's winner, or cuBLAS).

`--weights fp8` measures float8 weights with their scales (`--quantization fp8`) against what runs without an entry
for them, rt/fp8_gemm's float8 GEMM (the rows quantized, cuBLASLt), and writes entries of dtype "float8_e4m3fn".
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vox_serve.rt import fp8_gemm, small_gemm, triton_ops  # noqa: E402
from vox_serve.rt.small_gemm import BlockConfig, Kind  # noqa: E402

L2_BYTES = 160 << 20  # cycle over at least this much weight per replay


def weight_copies(weight_bytes: int) -> int:
    """How many copies of a weight a replay cycles over so that each launch reads it from HBM (2-64)."""
    return max(2, min(64, math.ceil(L2_BYTES / weight_bytes)))


@dataclass(frozen=True)
class Shape:
    model: str
    name: str
    kind: Kind
    n: int  # output columns (the gated kind: the intermediate width; its weight has 2n rows)
    k: int


def decoder_shapes(model: str, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int) -> list[Shape]:
    qkv = (heads + 2 * kv_heads) * head_dim
    return [Shape(model, "qkv", Kind.NORM, qkv, hidden), Shape(model, "o", Kind.PLAIN, hidden, heads * head_dim),
            Shape(model, "gate_up", Kind.GATED, inter, hidden), Shape(model, "down", Kind.PLAIN, hidden, inter),
            Shape(model, "gate+down", Kind.GATED_IN, hidden, inter)]  # down with the gate (gate_up unfused)


MODELS = {
    "orpheus": decoder_shapes("orpheus-3b", 3072, 8192, 24, 8, 128),
    "qwen3": [*decoder_shapes("qwen3-talker-1.7b", 2048, 6144, 16, 8, 128),
              *decoder_shapes("qwen3-predictor", 1024, 3072, 16, 8, 128),
              Shape("qwen3-predictor", "in_proj", Kind.PLAIN, 1024, 2048),
              Shape("qwen3-predictor", "head", Kind.NORM, 2048, 1024)],
    "csm": [*decoder_shapes("csm-backbone-1b", 2048, 8192, 32, 8, 64),
            *decoder_shapes("csm-depth", 1024, 8192, 8, 2, 128),
            Shape("csm-depth", "head", Kind.NORM, 2051, 1024)],
}

FMA_CONFIGS = [BlockConfig(4, 256), BlockConfig(2, 512), BlockConfig(4, 512), BlockConfig(8, 512),
               BlockConfig(1, 1024), BlockConfig(2, 1024), BlockConfig(4, 1024), BlockConfig(2, 2048),
               BlockConfig(4, 1024, stages=1), BlockConfig(4, 512, unroll=True), BlockConfig(2, 1024, unroll=True),
               BlockConfig(8, 256, unroll=True)]
DOT_CONFIGS = [BlockConfig(16, 128, dot=True), BlockConfig(16, 256, dot=True, stages=4),
               BlockConfig(32, 128, dot=True, stages=4), BlockConfig(16, 512, dot=True),
               BlockConfig(32, 256, dot=True), BlockConfig(64, 64, dot=True, stages=4),
               BlockConfig(16, 256, dot=True, unroll=True)]
# float8 weights move half the bytes per element: longer K blocks keep as many bytes in flight per program
FP8_FMA_CONFIGS = [BlockConfig(1, 2048), BlockConfig(1, 4096), BlockConfig(2, 4096), BlockConfig(4, 2048),
                   BlockConfig(8, 1024), BlockConfig(2, 2048, stages=2), BlockConfig(4, 2048, stages=2)]
FMA_MAX_ROWS = 4
FMA_TILE_PER_WARP = 2048  # accumulator floats per warp (64 per thread): bucket x block_n x block_k (x 2 gated)
MAX_UNROLLED_STEPS = 8
MAX_COMPILE_ATTEMPTS = 30


def candidates(shape: Shape, m: int, fp8: bool = False) -> list[BlockConfig]:
    halves = 2 if shape.kind is Kind.GATED else 1

    def fits(c: BlockConfig) -> bool:
        if c.unroll and math.ceil(shape.k / c.block_k) > MAX_UNROLLED_STEPS:
            return False
        return c.dot or small_gemm.rows_bucket(m) * c.block_n * c.block_k * halves <= FMA_TILE_PER_WARP * c.warps

    fma = FMA_CONFIGS + (FP8_FMA_CONFIGS if fp8 else []) if m <= FMA_MAX_ROWS else []
    return [c for c in fma + DOT_CONFIGS if fits(c)]


class Case:
    """One shape at m rows: weight copies, the inputs, and the two ways of computing it. The gated-input kind's
    unfused side runs its down projection as the table would without it: `plain`, the configuration that won for
    the plain shape, or cuBLAS."""

    def __init__(self, shape: Shape, m: int, plain: BlockConfig | None = None, fp8: bool = False) -> None:
        self.plain = plain
        rows = 2 * shape.n if shape.kind is Kind.GATED else shape.n
        bytes_per = rows * shape.k * (1 if fp8 else 2)
        copies = weight_copies(bytes_per)
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.shape, self.m = shape, m
        self.weights = [torch.randn(rows, shape.k, device="cuda", generator=gen, dtype=torch.bfloat16) / 32
                        for _ in range(copies)]
        self.scales: dict[int, torch.Tensor] = {}  # a float8 weight's scales, by the weight's id
        if fp8:
            quantized = [fp8_gemm.quantize_weight(w) for w in self.weights]
            self.weights = [wq for wq, _ in quantized]
            self.scales = {id(wq): scale for wq, scale in quantized}
        width = 2 * shape.k if shape.kind is Kind.GATED_IN else shape.k  # the gated input: gate and up
        self.x = torch.randn(m, width, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.delta = torch.randn(m, shape.k, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.norm = SimpleNamespace(weight=torch.rand(shape.k, device="cuda", generator=gen).to(torch.bfloat16) + 0.5,
                                    eps=1e-6)

    def _project(self, x: torch.Tensor, w: torch.Tensor, exact: bool) -> torch.Tensor:
        """x @ w.T without a table entry: cuBLAS, or for a float8 weight its float8 GEMM (`exact`: over the
        dequantized weight, what the weight-only kernels compute)."""
        scale = self.scales.get(id(w))
        if scale is None:
            return F.linear(x, w)
        return F.linear(x, fp8_gemm.dequantize_weight(w, scale, x.dtype)) if exact else fp8_gemm.scaled_linear(
            x, w, scale)

    def reference(self, w: torch.Tensor) -> torch.Tensor:
        """What the fused kernels must compute (the unfused ops; over a float8 weight's dequantized values)."""
        return self.unfused(w, exact=True)

    def unfused(self, w: torch.Tensor, exact: bool = False) -> torch.Tensor:
        if self.shape.kind is Kind.PLAIN:
            return self._project(self.x, w, exact)
        if self.shape.kind is Kind.GATED_IN:
            gated = triton_ops.silu_mul(self.x)
            if self.plain is None or exact:
                return self._project(gated, w, exact)
            small_gemm.forced = lambda kind, m, n, k: self.plain
            try:
                return small_gemm.linear(gated, w, scale=self.scales.get(id(w)))
            finally:
                small_gemm.forced = None
        _, h = triton_ops.add_rms_norm(self.x, self.delta, self.norm.weight, self.norm.eps)
        y = self._project(h, w, exact)
        return triton_ops.silu_mul(y) if self.shape.kind is Kind.GATED else y

    def fused(self, w: torch.Tensor) -> torch.Tensor:
        scale = self.scales.get(id(w))
        if self.shape.kind is Kind.PLAIN:
            return small_gemm.linear(self.x, w, scale=scale)
        if self.shape.kind is Kind.GATED_IN:
            return small_gemm.gated_linear(self.x, w, scale=scale)
        fn = small_gemm.norm_gated if self.shape.kind is Kind.GATED else small_gemm.norm_linear
        return fn(self.x, self.delta, self.norm, w, scale=scale)[1]


def graph_us(fn, weights: list[torch.Tensor], replays: int = 20) -> float:
    """Microseconds per call of fn(w), replayed in a CUDA graph over the weight copies."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for w in weights[:2]:
            fn(w)  # compile / warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for w in weights:
            fn(w)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (replays * len(weights))


def compile_key(shape: Shape, m: int, config: BlockConfig) -> str:
    """What a compiled kernel depends on: the kind, K, the rows block and the configuration (N is an argument)."""
    block_m = small_gemm.MAX_ROWS if config.dot else small_gemm.rows_bucket(m)
    return f"{shape.kind.value} k={shape.k} block_m={block_m} {config.as_list()}"


def usable(case: Case, crashed: set[str]) -> list[BlockConfig]:
    shape, m = case.shape, case.m
    return [c for c in candidates(shape, m, fp8=bool(case.scales)) if compile_key(shape, m, c) not in crashed]


def compile_only(case: Case, crashed: set[str]) -> None:
    """Each candidate run once, its kernel compiled into Triton's cache; "begin KEY" before each, so that a
    compiler crash (an abort, which no try catches) names the configuration that caused it."""
    for config in usable(case, crashed):
        print("begin", compile_key(case.shape, case.m, config), flush=True)
        small_gemm.forced = lambda kind, m, n, k, c=config: c
        try:
            case.fused(case.weights[0])
        finally:
            small_gemm.forced = None
    torch.cuda.synchronize()


def compile_in_parallel(args: argparse.Namespace, jobs: int, crashed_file: Path) -> set[str]:
    """Fill Triton's cache from `jobs` processes; a shard that crashes Triton's compiler is run again without the
    configuration it was compiling. Returns the configurations that crashed (left out of the measurement)."""
    crashed: set[str] = set()
    pending = list(range(jobs))
    for _attempt in range(MAX_COMPILE_ATTEMPTS):
        crashed_file.write_text("".join(f"{key}\n" for key in sorted(crashed)))
        logs = {i: crashed_file.with_name(f"{crashed_file.stem}.shard{i}.log") for i in pending}
        procs = {i: subprocess.Popen([sys.executable, __file__, "--compile-only", "--shard", f"{i}/{jobs}",
                                      "--rows", args.rows, "--models", args.models, "--weights", args.weights,
                                      "--skip", str(crashed_file)],
                                     stdout=logs[i].open("w"), stderr=subprocess.STDOUT)
                 for i in pending}
        failed = []
        for i, proc in procs.items():
            proc.wait()
            output = logs[i].read_text()
            if proc.returncode != 0:
                begun = [line.removeprefix("begin ") for line in output.splitlines() if line.startswith("begin ")]
                if not begun:
                    raise RuntimeError(f"compile shard {i} failed before compiling anything:\n{output[-2000:]}")
                crashed.add(begun[-1])
                failed.append(i)
                print(f"shard {i}: the compiler crashed on {begun[-1]} (left out)", flush=True)
        if not failed:
            return crashed
        pending = failed
    raise RuntimeError(f"compile shards {pending} still crash after {MAX_COMPILE_ATTEMPTS} attempts")


def measure(case: Case, crashed: set[str]) -> dict:
    base = graph_us(case.unfused, case.weights)
    ref = case.reference(case.weights[0]).float()
    tried = []
    for config in usable(case, crashed):
        small_gemm.forced = lambda kind, m, n, k, c=config: c
        try:
            got = case.fused(case.weights[0]).float()
            err = ((got - ref).abs().max() / (ref.abs().max() + 1e-6)).item()
            tried.append({"config": config.as_list(), "us": graph_us(case.fused, case.weights), "err": err})
        finally:
            small_gemm.forced = None
    best = min(tried, key=lambda t: t["us"])
    s = case.shape
    weight_bytes = case.weights[0].numel() * case.weights[0].element_size()
    return {"model": s.model, "name": s.name, "kind": s.kind.value, "n": s.n, "k": s.k, "rows": case.m,
            "unfused_us": base, "best": best, "speedup": base / best["us"],
            "floor_us": weight_bytes / 4.8e12 * 1e6, "tried": tried}


def won(result: dict, min_speedup: float) -> bool:
    """Whether a measured shape gets a table entry: fast enough over the unfused ops, and right."""
    return result["speedup"] >= min_speedup and result["best"]["err"] < 0.05


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="every measurement (JSON)")
    p.add_argument("--table", type=Path, help="the winning configurations (JSON)")
    p.add_argument("--compile-jobs", type=int, default=0,
                   help="compile the candidates first in this many processes (compiling is most of the time)")
    p.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)  # a compile shard
    p.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)  # I/N: every N-th shape x rows case from I
    p.add_argument("--skip", type=Path, help=argparse.SUPPRESS)  # configurations that crashed the compiler
    p.add_argument("--rows", default="1,2,4,8,16")
    p.add_argument("--models", default="orpheus,qwen3,csm")
    p.add_argument("--weights", choices=["model", "fp8"], default="model",
                   help="fp8: float8 weights with their scales (--quantization fp8), entries of their own dtype")
    p.add_argument("--min-speedup", type=float, default=1.03, help="an entry needs this ratio over the unfused ops")
    args = p.parse_args()
    if not args.compile_only and (args.out is None or args.table is None):
        p.error("--out and --table are needed")
    index, count = (int(v) for v in args.shard.split("/"))
    cases = [(shape, int(r)) for model in args.models.split(",") for shape in MODELS[model]
             for r in args.rows.split(",")][index::count]
    crashed = set(args.skip.read_text().split("\n")) - {""} if args.skip else set()
    if args.compile_only:
        for shape, m in cases:
            compile_only(Case(shape, m, fp8=args.weights == "fp8"), crashed)
        return
    if args.compile_jobs > 0:
        crashed = compile_in_parallel(args, args.compile_jobs, args.out.with_suffix(".crashed.txt"))
    results = []
    plain_won: dict[tuple[str, int, int, int], BlockConfig] = {}  # (model, n, k, rows) of the plain entries
    for shape, m in cases:
        r = measure(Case(shape, m, plain_won.get((shape.model, shape.n, shape.k, m)), fp8=args.weights == "fp8"),
                    crashed)
        results.append(r)
        if shape.kind is Kind.PLAIN and won(r, args.min_speedup):
            plain_won[(shape.model, shape.n, shape.k, m)] = BlockConfig.of_list(r["best"]["config"])
        print(f"{r['model']:18s} {r['name']:8s} {r['kind']:5s} N={r['n']:5d} K={r['k']:5d} m={m:2d}: "
              f"unfused {r['unfused_us']:7.2f} us, fused {r['best']['us']:7.2f} us {r['best']['config']} "
              f"(x{r['speedup']:.2f}, floor {r['floor_us']:.2f} us, err {r['best']['err']:.1e})", flush=True)
    entries = {}
    dtype = "float8_e4m3fn" if args.weights == "fp8" else "bfloat16"
    for r in results:
        if won(r, args.min_speedup):
            key = (r["kind"], dtype, small_gemm.rows_bucket(r["rows"]), r["n"], r["k"])
            entries[key] = {"kind": r["kind"], "dtype": dtype, "rows": key[2], "n": r["n"], "k": r["k"],
                            "config": r["best"]["config"]}
    device = torch.cuda.get_device_name()
    args.out.write_text(json.dumps({"device": device, "compiler_crashed": sorted(crashed), "results": results},
                                   indent=1))
    args.table.write_text(json.dumps({"device": device, "made_by": "benchmark/small_gemm.py", "entries":
                                      list(entries.values())}, indent=1))
    print(f"{len(entries)} entries of {len(results)} shapes x rows -> {args.table} "
          f"(default path for this GPU: {small_gemm.table_path(device)})")


if __name__ == "__main__":
    main()

"""Device time of one decode-attention launch: the planless Triton kernel of vox_serve/rt/attention/triton_decode.py
against FlashInfer's graph-mode decode (CUDA-core and tensor-core kernels, the latter also planned without split
KV and on its SM90 backend, fa3) and its XQA decode (TensorRT-LLM's kernel, planless; Hopper and later), per batch
bucket and KV length. A candidate that fails on this machine (no module for it, an unsupported shape) is reported
as such and the others still run.

    python benchmark/decode_attention.py [--rows 1,2,4,8,16,32,64] [--kv 256,1024,2048] [--geometry orpheus,qwen3]
        [--kv-dtype fp8] [--block-n 64 --stages 3 --warps 8]

Each case holds a model's layers of paged KV (pages of 16, bfloat16, pages shuffled), so one launch's KV is not
in L2 from the previous one, and captures one launch per layer in a CUDA graph, replayed; reported: microseconds
per launch (the layer's attention; FlashInfer's count includes its merge kernel). Every row has the same KV
length. The kernel's output is checked against FlashInfer's on each case (and against a float32 reference in
tests/test_decode_attention.py, through Triton's interpreter on the CPU).

The kernel is vox_serve/rt/attention/triton_decode.py (FlashInferAttentionBackend serves the 1-2 row decode
buckets with it). Its first form, whose merge read every split's partials padded to 16 heads in one load, lost at
1-32 rows (benchmark/results/h200-2026-12-03b); the form since, which merges only the non-empty splits' real heads,
wins at 1-2 rows (benchmark/results/h200-2026-12-03d).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmark.sampler import graph_us  # noqa: E402
from vox_serve.rt.attention.triton_decode import (  # noqa: E402
    DEFAULT_CONFIG,
    PROGRAMS_PER_SM,
    DecodeConfig,
    DecodeWorkspace,
    decode_attention,
    splits_for,
)

GEOMETRIES = {"orpheus": (28, 24, 8), "qwen3": (28, 16, 8)}  # layers, query heads, KV heads (head dim 128)
PAGE, DIM = 16, 128
MAX_TOKENS = 1 << 18  # rows x KV length per case (the caches of every layer must fit)


def flashinfer_decode(tensor_cores: bool, rows: int, table: torch.Tensor, kv_len: int, hq: int, hkv: int,
                      split: bool = True, backend: str = "auto", kv_dtype: torch.dtype = torch.bfloat16):
    """FlashInfer's graph-mode decode planned for the case; `split=False` (tensor cores only) plans it with
    disable_split_kv: one kernel, no merge; `backend="fa3"` (tensor cores) runs its SM90 prefill kernels."""
    import flashinfer

    pages = table.shape[1]
    dev = table.device
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(128 << 20, dtype=torch.uint8, device=dev), "NHD", use_cuda_graph=True,
        use_tensor_cores=tensor_cores, backend=backend,
        paged_kv_indptr_buffer=torch.zeros(rows + 1, dtype=torch.int32, device=dev),
        paged_kv_indices_buffer=table.flatten().clone(),
        paged_kv_last_page_len_buffer=torch.zeros(rows, dtype=torch.int32, device=dev))
    indptr = torch.arange(rows + 1, dtype=torch.int32) * pages
    last = torch.full((rows,), kv_len - (pages - 1) * PAGE, dtype=torch.int32)
    wrapper.plan(indptr, table.flatten(), last, num_qo_heads=hq, num_kv_heads=hkv, head_dim=DIM, page_size=PAGE,
                 q_data_type=torch.bfloat16, kv_data_type=kv_dtype, sm_scale=DIM ** -0.5,
                 **({} if split else {"disable_split_kv": True}))
    return wrapper


def xqa_decode(q: torch.Tensor, kv_lens: torch.Tensor, table: torch.Tensor):
    """FlashInfer's XQA decode over the same paged cache [P, 2, page, Hkv, D] (NHD) and page table: no plan; its
    workspace (semaphores first) zeroed once, as it requires. Its grid seems to follow the page table's width (the
    longest sequence it could hold), not the rows' lengths (`--table-tokens` sets that width)."""
    import flashinfer

    work = torch.zeros(256 << 20, dtype=torch.uint8, device=q.device)
    seq_lens = kv_lens.view(torch.uint32)
    return lambda cache: flashinfer.decode.xqa_batch_decode_with_kv_cache(
        q, cache, work, table, seq_lens, table.shape[1] * PAGE, bmm1_scale=DIM ** -0.5, bmm2_scale=1.0,
        kv_layout="NHD")


@dataclass
class Case:
    """One shape's operands: every layer's paged cache (pages shuffled), the page table (and its `table_tokens`
    wide copy for the planless kernels), the rows' KV lengths and queries."""

    geometry: str
    rows: int
    kv_len: int
    caches: list[torch.Tensor]
    own: list[torch.Tensor]  # what the Triton kernel reads: the caches, or their float8 copies
    table: torch.Tensor
    wide: torch.Tensor
    kv_lens: torch.Tensor
    q: torch.Tensor

    @classmethod
    def make(cls, geometry: str, rows: int, kv_len: int, table_tokens: int = 0, fp8: bool = False) -> Case:
        layers, hq, hkv = GEOMETRIES[geometry]
        dev = torch.device("cuda")
        pages = -(-kv_len // PAGE)
        num_pages = rows * pages + 1
        caches = [torch.randn(num_pages, 2, PAGE, hkv, DIM, device=dev, dtype=torch.bfloat16) for _ in range(layers)]
        table = (torch.randperm(num_pages - 1, device=dev)[: rows * pages] + 1).view(rows, pages).to(torch.int32)
        wide = torch.nn.functional.pad(table, (0, max(0, -(-table_tokens // PAGE) - pages)))
        own = [c.to(torch.float8_e4m3fn) for c in caches] if fp8 else caches
        return cls(geometry=geometry, rows=rows, kv_len=kv_len, caches=caches, own=own, table=table, wide=wide,
                   kv_lens=torch.full((rows,), kv_len, dtype=torch.int32, device=dev),
                   q=torch.randn(rows, hq, DIM, device=dev, dtype=torch.bfloat16))

    def read_us(self) -> float:
        """The read floor: microseconds per launch of a reduction over one layer's cache (the bytes the kernel
        reads)."""
        layers = GEOMETRIES[self.geometry][0]
        layer = itertools.count()
        return graph_us(lambda: self.own[next(layer) % layers].view(torch.float32).sum(), layers)

    def triton(self, config: DecodeConfig, per_sm: int) -> tuple[float, torch.Tensor]:
        """The Triton kernel's microseconds per launch under `config`, and its output on layer 0."""
        layers, hq, hkv = GEOMETRIES[self.geometry]
        sms = torch.cuda.get_device_properties(self.q.device).multi_processor_count
        ws = DecodeWorkspace.allocate(self.rows, hkv, hq // hkv, DIM, splits_for(self.rows, hkv, sms, per_sm),
                                      self.q.device)
        layer = itertools.count()  # each call takes the next layer's cache

        def call(cache: torch.Tensor) -> torch.Tensor:
            return decode_attention(self.q, cache, self.wide, self.kv_lens, DIM ** -0.5, ws, config)

        us = graph_us(lambda: call(self.own[next(layer) % layers]), layers)
        return us, call(self.own[0])

    def flashinfer(self, tensor_cores: bool) -> tuple[float, torch.Tensor]:
        """FlashInfer's graph-mode decode over the caches the Triton kernel reads (float8 ones too): microseconds
        per launch, and its output on layer 0."""
        layers, hq, hkv = GEOMETRIES[self.geometry]
        wrapper = flashinfer_decode(tensor_cores, self.rows, self.table, self.kv_len, hq, hkv,
                                    kv_dtype=self.own[0].dtype)
        layer = itertools.count()
        us = graph_us(lambda: wrapper.run(self.q, self.own[next(layer) % layers]), layers)
        return us, wrapper.run(self.q, self.own[0])


def case(geometry: str, rows: int, kv_len: int, config: DecodeConfig, per_sm: int,
         table_tokens: int = 0, fp8: bool = False) -> dict[str, float]:
    """One shape's times and differences; the planless kernels (Triton, XQA) read a page table `table_tokens` wide
    (its padding the null page 0), as a serving step's table is `--max-model-len` wide; FlashInfer reads the pages
    planned. `fp8`: the Triton kernel reads the caches stored as float8 (`--kv-cache-dtype fp8`), the others the
    bfloat16 originals (its differences then include the float8 rounding)."""
    c = Case.make(geometry, rows, kv_len, table_tokens, fp8)
    layers, hq, hkv = GEOMETRIES[geometry]
    out: dict[str, float] = {}
    out["triton"], got = c.triton(config, per_sm)
    layer = itertools.count()

    def wrapper_run(tc: bool, split: bool, backend: str) -> Callable[[torch.Tensor], torch.Tensor]:
        wrapper = flashinfer_decode(tc, rows, c.table, kv_len, hq, hkv, split, backend)
        return lambda cache: wrapper.run(c.q, cache)

    makers: dict[str, Callable[[], Callable[[torch.Tensor], torch.Tensor]]] = {
        "flashinfer": lambda: wrapper_run(False, True, "auto"),
        "flashinfer_tc": lambda: wrapper_run(True, True, "auto"),
        "flashinfer_tc_nosplit": lambda: wrapper_run(True, False, "auto"),
        "flashinfer_fa3": lambda: wrapper_run(True, True, "fa3"),
        "xqa": lambda: xqa_decode(c.q, c.kv_lens, c.wide),
    }
    for name, make in makers.items():
        try:
            run = make()
            ref = run(c.caches[0])
            out[name] = graph_us(lambda run=run: run(c.caches[next(layer) % layers]), layers)
            out[f"err_{name}"] = (got.float() - ref.float()).abs().max().item()
        except Exception as e:  # noqa: BLE001 - a candidate this machine cannot run: reported, the others go on
            print(f"  {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            out[name], out[f"err_{name}"] = float("nan"), float("nan")
    return out


def parse_config(text: str) -> DecodeConfig:
    try:
        return DecodeConfig.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def shapes(args: argparse.Namespace) -> Iterator[tuple[str, int, int]]:
    """(geometry, KV length, rows) of every case asked for whose caches fit (MAX_TOKENS)."""
    for geometry, kv_len, rows in itertools.product(args.geometry.split(","), map(int, args.kv.split(",")),
                                                    map(int, args.rows.split(","))):
        if rows * kv_len <= MAX_TOKENS:
            yield geometry, kv_len, rows


def checked_time(run: Callable[[], tuple[float, torch.Tensor]], first: torch.Tensor | None, name: str
                 ) -> tuple[float, torch.Tensor | None]:
    """A candidate's microseconds (nan when it fails here or its output differs from `first` by 5e-2 or more),
    and the output later candidates are checked against."""
    try:
        us, got = run()
    except Exception as e:  # noqa: BLE001 - a candidate this GPU cannot run (its resources, no module): reported
        print(f"  {name} failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
        return float("nan"), first
    first = got if first is None else first
    return (us if (got.float() - first.float()).abs().max().item() < 5e-2 else float("nan")), first


def sweep(args: argparse.Namespace, configs: list[DecodeConfig]) -> None:
    """The Triton kernel alone under each configuration, per case (with --flashinfer FlashInfer's decode after
    them); the best per case marked, every output checked against the first; last, the configuration nearest
    each case's best Triton time over all cases (geometric mean), as `best NAME`."""
    slowdown = [0.0] * len(configs)  # sum of log(time / the case's best Triton time)
    for geometry, kv_len, rows in shapes(args):
        c = Case.make(geometry, rows, kv_len, args.table_tokens, args.kv_dtype == "fp8")
        runs = [(config.name, functools.partial(c.triton, config, args.programs_per_sm)) for config in configs]
        runs += [(f"flashinfer (tensor cores {tc})", functools.partial(c.flashinfer, tc))
                 for tc in ((False, True) if args.flashinfer else ())]
        times, first = [], None
        for name, run in runs:
            us, first = checked_time(run, first, name)
            times.append(us)
        ranked = [t if t == t else math.inf for t in times]  # failures last
        best = ranked.index(min(ranked))
        cells = " ".join(f"{t:7.2f}{'*' if i == best else ' '}" for i, t in enumerate(times))
        floor = f" | read {c.read_us():7.2f}" if args.read_floor else ""
        print(f"{geometry:8s} {args.kv_dtype:8s} kv {kv_len:5d} rows {rows:3d}: {cells}{floor}", flush=True)
        fastest = min(ranked[: len(configs)])
        for i, t in enumerate(ranked[: len(configs)]):
            slowdown[i] += math.log(t / fastest) if t < math.inf else math.inf
        del c
        torch.cuda.empty_cache()
    print(f"best {configs[slowdown.index(min(slowdown))].name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--kv", default="256,1024,2048")
    parser.add_argument("--geometry", default="orpheus,qwen3")
    parser.add_argument("--block-n", type=int, default=DEFAULT_CONFIG.block_n)
    parser.add_argument("--warps", type=int, default=DEFAULT_CONFIG.warps)
    parser.add_argument("--stages", type=int, default=DEFAULT_CONFIG.stages)
    parser.add_argument("--table-tokens", type=int, default=0,
                        help="page-table width in tokens for the planless kernels (a server's --max-model-len; "
                             "default: each case's KV length)")
    parser.add_argument("--programs-per-sm", type=int, default=PROGRAMS_PER_SM, help="sets the split counts")
    parser.add_argument("--kv-dtype", choices=["bfloat16", "fp8"], default="bfloat16",
                        help="the cache the Triton kernel reads (FlashInfer's always bfloat16)")
    parser.add_argument("--configs", type=lambda text: [parse_config(t) for t in text.split(",")], default=None,
                        help="sweep the Triton kernel alone over these, e.g. 32/4/2,64/4/3,64/8/3/h "
                             "(BLOCK_N/WARPS/STAGES, /h: head-major programs)")
    parser.add_argument("--flashinfer", action="store_true",
                        help="with --configs: FlashInfer's CUDA-core and tensor-core decode too, over the same caches")
    parser.add_argument("--read-floor", action="store_true",
                        help="with --configs: the time of one reduction over a layer's cache too (its bytes' floor)")
    args = parser.parse_args()
    if args.configs:
        print("configs: " + " ".join(c.name for c in args.configs) + (" flashinfer flashinfer_tc" if args.flashinfer
                                                                        else ""))
        sweep(args, args.configs)
        return
    config = DecodeConfig(block_n=args.block_n, warps=args.warps, stages=args.stages)
    print(f"config {config}, splits per bucket at {torch.cuda.get_device_properties(0).multi_processor_count} SMs")
    for geometry, kv_len, rows in shapes(args):
        r = case(geometry, rows, kv_len, config, args.programs_per_sm, args.table_tokens, args.kv_dtype == "fp8")
        best = min(r["flashinfer"], r["flashinfer_tc"])
        print(f"{geometry:8s} kv {kv_len:5d} rows {rows:3d}: triton {r['triton']:7.2f} us, flashinfer "
              f"{r['flashinfer']:7.2f} us, tensor cores {r['flashinfer_tc']:7.2f} us, unsplit "
              f"{r['flashinfer_tc_nosplit']:7.2f} us, fa3 {r['flashinfer_fa3']:7.2f} us, xqa "
              f"{r['xqa']:7.2f} us (x{best / r['triton']:.2f}; max diff {r['err_flashinfer']:.1e}, fa3 "
              f"{r['err_flashinfer_fa3']:.1e}, xqa {r['err_xqa']:.1e})", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Device time of one sampling launch: the Rust CUDA kernel (rust_ops.sample) against the Triton sampler
(triton_ops.sample, where the vocabulary fits) and the PyTorch reference (rt.kernels.sample_unfused).

    python benchmark/sampler.py [--rows 1,16,64,256] [--vocabs 2048,3072,4097,8192] [--logits ties] [--out FILE]

Each case is captured as a CUDA graph of `--reps` launches and replayed; reported: microseconds per launch.
Parameter sets (every row alike but for its seed): the serving defaults of the models (Orpheus: temperature
0.6, top-p 0.8, repetition penalty 1.1 over a 64-token history; Qwen3-TTS: temperature 0.9, top-k 50), greedy,
top-k alone, top-p alone and top-k with top-p. Logits (`--logits`): seeded Gaussian noise scaled by 3 (a peaked
distribution, as a trained head gives; the default), all equal, or noise with a third of the ids at -inf.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vox_serve.rt import kernels, rust_ops, triton_ops  # noqa: E402

HISTORY = 64
PARAMS = {
    "orpheus_defaults": {"temperature": 0.6, "top_p": 0.8, "repetition_penalty": 1.1},
    "qwen3_defaults": {"temperature": 0.9, "top_k": 50},
    "greedy": {"temperature": 0.0},
    "top_k_50": {"temperature": 1.0, "top_k": 50},
    "top_p_0.9": {"temperature": 1.0, "top_p": 0.9},
    "top_k_50_top_p_0.9": {"temperature": 1.0, "top_k": 50, "top_p": 0.9},
}


def graph_us(fn: Callable[[], object], reps: int) -> float:
    """Microseconds per call of `fn`, captured `reps` times in one CUDA graph (launch overhead excluded)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / (5 * reps)


def _masked(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    logits = torch.randn(rows, vocab, generator=gen) * 3
    return logits.masked_fill(torch.rand(rows, vocab, generator=gen) < 1 / 3, float("-inf"))


# Logit distributions: peaked noise (a trained head), every logit equal (what --load-format dummy's heads
# give: the radix select's bins then hold every key), a third of the ids masked to -inf (constrained heads).
LOGITS: dict[str, Callable[[torch.Generator, int, int], torch.Tensor]] = {
    "noise": lambda gen, rows, vocab: torch.randn(rows, vocab, generator=gen) * 3,
    "ties": lambda gen, rows, vocab: torch.zeros(rows, vocab),
    "masked": _masked,
}


def case(rows: int, vocab: int, spec: dict[str, float], dist: str = "noise") -> dict[str, Callable[[], object]]:
    """The samplers on one batch, each a no-argument call."""
    gen = torch.Generator().manual_seed(rows * 10007 + vocab)
    logits = LOGITS[dist](gen, rows, vocab).cuda()
    p = kernels.SamplingTensors.filled(rows, device="cuda", **spec)
    p.seed.copy_(torch.randint(0, 2**40, (rows,), generator=gen))
    history = torch.randint(0, vocab, (rows, HISTORY), generator=gen).cuda() if "repetition_penalty" in spec else None
    calls = {
        "rust": lambda: rust_ops.sample(logits, None, history, p.repetition_penalty, p.temperature, p.top_k, p.top_p,
                                        p.min_p, p.seed, p.offset, kernels._SALT_UNIFORM),
        "torch": lambda: kernels.sample_unfused(logits, p, history, None),
    }
    if triton_ops.triton is not None and vocab <= triton_ops.MAX_SAMPLE_VOCAB and history is None:
        calls["triton"] = lambda: triton_ops.sample(logits, None, p.temperature, p.top_k, p.top_p, p.min_p, p.seed,
                                                    p.offset, kernels._SALT_UNIFORM)
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,16,64,256")
    ap.add_argument("--vocabs", default="2048,3072,4097,8192")
    ap.add_argument("--params", default=",".join(PARAMS), help=f"comma-separated, of {sorted(PARAMS)}")
    ap.add_argument("--reps", type=int, default=20, help="launches per captured graph")
    ap.add_argument("--logits", default="noise", choices=sorted(LOGITS), help="the logits' distribution")
    ap.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and rust_ops.available()):
        sys.exit("needs a CUDA device and the Rust extension built with its CUDA kernels")
    results = []
    print(f"{'params':<20} {'rows':>5} {'vocab':>6} " + " ".join(f"{n:>9}" for n in ("rust", "triton", "torch"))
          + "   (us per launch)")
    for name in args.params.split(","):
        for vocab in (int(v) for v in args.vocabs.split(",")):
            for rows in (int(r) for r in args.rows.split(",")):
                us = {k: graph_us(fn, args.reps) for k, fn in case(rows, vocab, PARAMS[name], args.logits).items()}
                results.append({"params": name, "logits": args.logits, "rows": rows, "vocab": vocab, "us": us})
                cells = " ".join(f"{us[k]:9.2f}" if k in us else f"{'-':>9}" for k in ("rust", "triton", "torch"))
                print(f"{name:<20} {rows:>5} {vocab:>6} {cells}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

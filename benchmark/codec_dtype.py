"""The SNAC codec's device time and error by dtype: float32 (what Orpheus serves with) against bfloat16.

    python benchmark/codec_dtype.py [--batches 1,16,64,256] [--frames 4] [--out FILE]

SNAC 24 kHz at its real geometry with seeded random weights (no checkpoint can be downloaded here):
a batch of Orpheus codec windows (lookback 1 + `--frames` + lookahead 2 frames of 7 codes, the
server's default chunk) decoded as one CUDA graph per dtype and batch; reported per batch: replay
ms and ms per window, and the bfloat16 output's error against float32 (SNR in dB over the whole
batch, and the largest sample error in int16 steps). `--mixed` also measures bfloat16 decoder
blocks with the last convolution (and its activation) in float32.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vox_serve.codecs.snac import SnacConfig, SnacDecoder, orpheus_frames_to_codes  # noqa: E402
from vox_serve.models.orpheus.loader import SNAC_24KHZ_CONFIG  # noqa: E402

WINDOW_EXTRA = 3  # lookback 1 + lookahead 2 frames


def graphed(fn, *args):  # noqa: ANN001, ANN202 (a benchmark helper)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    return graph, out


def replay_ms(graph: torch.cuda.CUDAGraph, reps: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


class ToFloat(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()


def decoder(dtype: torch.dtype, mixed: bool, base: SnacDecoder) -> SnacDecoder:
    model = copy.deepcopy(base).to(dtype)
    if mixed:  # the last activation, convolution and tanh in float32
        layers = list(model.decoder.model)
        model.decoder.model = torch.nn.Sequential(*layers[:-3], ToFloat(), *(m.float() for m in layers[-3:]))
    return model


def run(snac: SnacDecoder, codes: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        audio = snac.decode(orpheus_frames_to_codes(codes), noise_seed=seed)
    return (audio.float().clamp(-1, 1) * 32767).round()


def measure(base: SnacDecoder, batch: int, frames: int, mixed: bool) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(batch)
    codes = torch.randint(0, 4096, (batch, frames + WINDOW_EXTRA, 7), device="cuda", generator=gen)
    seed = torch.arange(batch, device="cuda", dtype=torch.int64)
    row = {"batch": batch, "window_frames": frames + WINDOW_EXTRA}
    outs = {}
    variants = [("float32", torch.float32, False), ("bfloat16", torch.bfloat16, False)]
    if mixed:
        variants.append(("bf16+fp32 tail", torch.bfloat16, True))
    for name, dtype, tail in variants:
        model = decoder(dtype, tail, base)
        graph, out = graphed(run, model, codes, seed)
        ms = replay_ms(graph)
        outs[name] = out.clone()
        row[name] = {"ms": round(ms, 3), "ms_per_window": round(ms / batch, 4)}
        del graph, model
    ref = outs["float32"]
    for name in outs:
        if name == "float32":
            continue
        err = outs[name] - ref
        snr = 10 * torch.log10(ref.pow(2).mean() / err.pow(2).mean().clamp_min(1e-12))
        row[name].update(snr_db=round(float(snr), 1), max_err_steps=int(err.abs().max()))
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,16,64,256")
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--mixed", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("codec_dtype.py measures CUDA graphs: it needs a GPU")
    base = SnacDecoder.random(SnacConfig.from_dict(SNAC_24KHZ_CONFIG), seed=1, device="cuda")
    rows = []
    for batch in map(int, args.batches.split(",")):
        row = measure(base, batch, args.frames, args.mixed)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

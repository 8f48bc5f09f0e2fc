"""Time the Qwen3-TTS codec's dense convolutions one by one: cuDNN, folding (dilated ones) and `conv_gemm`
with its default tile and others, at the shapes of a streaming window of 10 frames.

    python benchmark/conv_gemm.py [--windows 64,256] [--dtype bfloat16]

Prints, per layer and batch, ms per call and the TFLOP/s each reaches (2 * C_in * C_out * K * T * batch);
the best tile per shape is what `gemm_tile` should choose.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vox_serve.rt import codec_kernels, implicit_gemm  # noqa: E402
from vox_serve.rt.implicit_gemm import GemmTile  # noqa: E402

FRAMES = 10  # the Qwen3-TTS program's frames per codec chunk
# (C_in, C_out, kernel, dilation, samples per frame at the layer): the 1024 -> 1536 input convolution, then each
# decoder block's residual units (dilations 1, 3, 9) after its x8, x5, x4, x3 upsampling
LAYERS = [(1024, 1536, 7, 1, 4)] + [(c, c, 7, d, spf) for c, spf in ((768, 32), (384, 160), (192, 640), (96, 1920))
                                   for d in (1, 3, 9)]
TILES = [GemmTile(128, 128, 64, 8, 3), GemmTile(128, 128, 64, 4, 3), GemmTile(64, 128, 64, 4, 3),
         GemmTile(128, 64, 64, 4, 3), GemmTile(128, 256, 64, 8, 3), GemmTile(64, 256, 64, 8, 3),
         GemmTile(128, 128, 32, 4, 4), GemmTile(32, 256, 32, 4, 3), GemmTile(32, 128, 32, 4, 3)]


def per_call_ms(run, reps: int = 20) -> float:
    run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def time_layer(windows: int, layer: tuple[int, int, int, int, int], dtype: torch.dtype) -> None:
    c_in, c_out, kernel, dilation, spf = layer
    length = FRAMES * spf
    x = torch.randn(windows, c_in, (kernel - 1) * dilation + length, device="cuda", dtype=dtype)
    conv = torch.nn.Conv1d(c_in, c_out, kernel, dilation=dilation).to("cuda", dtype)
    taps = implicit_gemm.tap_weights(conv)
    flop = 2 * c_in * c_out * kernel * length * windows
    runs = {"cudnn": lambda: conv(x)}
    if dilation > 1:
        runs["folded"] = lambda: codec_kernels.folded_conv1d(x, conv.weight, conv.bias, dilation, 0)
    default = implicit_gemm.gemm_tile(c_in, c_out, kernel, length, dtype)
    runs[f"default {default}"] = lambda: implicit_gemm.conv_gemm(x, taps, conv.bias, dilation)
    for tile in TILES:
        runs[str(tile)] = lambda t=tile: implicit_gemm.conv_gemm(x, taps, conv.bias, dilation, tile=t)
    with torch.no_grad():
        err = (implicit_gemm.conv_gemm(x, taps, conv.bias, dilation).float() - conv(x).float()).abs().max().item()
        times = {}
        for name, run in runs.items():
            try:
                times[name] = per_call_ms(run)
            except Exception as e:  # noqa: BLE001 - a tile past the shared memory: listed as failed
                print(f"    {name}: {type(e).__name__}")
    best = min((v, k) for k, v in times.items())
    print(f"x{windows} {c_in}->{c_out} k{kernel} d{dilation} T{length}: max err {err:.3g}; best {best[1]} "
          f"{best[0]:.3f} ms ({flop / best[0] / 1e9:.0f} TFLOP/s)")
    for name, ms in times.items():
        print(f"    {ms:8.3f} ms {flop / ms / 1e9:6.0f} TFLOP/s  {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", default="16,64,256")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    for windows in (int(w) for w in args.windows.split(",")):
        for layer in LAYERS:
            time_layer(windows, layer, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()

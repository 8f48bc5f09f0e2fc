"""Device time of one depth-transformer step at one position: rt/depth_step's persistent kernel (per launch
settings) against the step's own kernels (small_gemm with the GPU's table, depth attention off, PDL as set),
on Qwen3-TTS-1.7B's code predictor (5 layers of 1024, 16/8 heads, a 2048 -> 1024 input projection, random
bfloat16 weights).

    python benchmark/depth_step.py [--rows 1,2,4] [--settings 2:4:8192,1:4:8192,...]

A setting is programs_per_sm:warps:acc_elements[:stages]. Each case captures 14 steps (a frame's one-position steps)
in a CUDA graph and replays it; reported: microseconds per step, the kernel's max difference from the unfused
logits, and the weight bytes a step reads over its time (the HBM's ~4.8 TB/s is the floor).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmark.sampler import graph_us  # noqa: E402
from vox_serve.layers.decoder import DecoderDims  # noqa: E402
from vox_serve.layers.depth import DepthTransformer  # noqa: E402
from vox_serve.rt import depth_step  # noqa: E402

DIMS = DecoderDims(vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_layers=5, num_heads=16,
                   num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6)
TALKER_HIDDEN, POSITIONS, STEPS = 2048, 16, 14


def predictor() -> DepthTransformer:
    depth = DepthTransformer(dims=DIMS, in_proj=nn.Linear(TALKER_HIDDEN, DIMS.hidden_size, bias=True),
                             num_positions=POSITIONS, num_heads_out=POSITIONS - 1,
                             rope={"rope_type": "default", "rope_theta": 1000000.0}, qk_norm=True)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in depth.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else noise / p.shape[-1] ** 0.5)
    depth = depth.to(device="cuda", dtype=torch.bfloat16)
    depth_step.forced = True
    depth.allocate(max_rows=16)
    return depth


def parse_setting(text: str) -> depth_step.Settings:
    values = [int(v) for v in text.split(":")]
    names = ("programs_per_sm", "warps", "acc_elements", "stages")
    return depth_step.Settings(**dict(zip(names, values, strict=False)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,4")
    parser.add_argument("--settings", default="2:4:8192,1:4:8192,4:4:8192,2:8:16384,1:8:16384,2:4:4096")
    args = parser.parse_args()
    depth = predictor()
    weight_bytes = sum(p.numel() * p.element_size() for name, p in depth.named_parameters() if "heads" not in name)
    weight_bytes += depth.heads[0].numel() * depth.heads.element_size()
    for rows in map(int, args.rows.split(",")):
        x = torch.randn(rows, 1, TALKER_HIDDEN, device="cuda", dtype=torch.bfloat16)
        starts = iter(range(10 ** 9))

        def step(x: torch.Tensor = x, starts: object = starts) -> torch.Tensor:
            k = next(starts) % STEPS
            return depth.step(x, start=k + 2, head=k + 1)

        depth_step.forced = False
        base = graph_us(step, STEPS)
        ref = depth.step(x, start=5, head=4)
        print(f"rows {rows}: unfused {base:7.2f} us/step ({weight_bytes / base / 1e6:.2f} TB/s)", flush=True)
        depth_step.forced = True
        for text in args.settings.split(","):
            depth_step.settings = parse_setting(text)
            try:
                us = graph_us(step, STEPS)
                got = depth.step(x, start=5, head=4)
            except Exception as e:  # noqa: BLE001 - report and go on with the next setting
                print(f"rows {rows}: setting {text}: failed: {str(e)[:200]}", flush=True)
                continue
            diff = (got - ref).abs().max().item()
            programs = max(n for key, n in depth_step._GRIDS.items() if key[1] == depth_step.settings)
            print(f"rows {rows}: kernel {text:14s} {us:7.2f} us/step ({weight_bytes / us / 1e6:.2f} TB/s, "
                  f"x{base / us:.2f}; programs {programs}; max diff {diff:.2e})", flush=True)


if __name__ == "__main__":
    main()

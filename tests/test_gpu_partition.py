"""GPU tier for SM partitions (`--codec-sms`, rt/partition.py): kernels on a partition's stream, eager and
in a graph captured on it and launched by handle from the Rust extension, run on no more SMs than the
partition has (read from each block's %smid), where the same kernel on an ordinary stream spreads wider;
the driver's events work on the partition's stream; and the Rust runtime with every codec launch on a
partition makes the audio of the unpartitioned run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rust_helpers import cuda_bench_wavs, require_rt

from vox_serve.rt.partition import sm_partition

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")]

PROGRAMS, BLOCK = 4096, 32


def _sm_ids_kernel():  # noqa: ANN202
    import triton
    import triton.language as tl

    @triton.jit
    def sm_ids(out_ptr, iters, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        acc = offs.to(tl.float32)
        for _ in range(iters):  # keep each block resident a while, so that blocks spread over every SM they may
            acc = acc * 1.0001 + 0.5
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [offs], dtype=tl.int32, is_pure=False, pack=1)
        tl.store(out_ptr + pid * BLOCK + offs, sm + (acc > 3.0e38).to(tl.int32))

    return sm_ids


def _launch(out: torch.Tensor) -> None:
    _sm_ids_kernel()[(PROGRAMS,)](out, 2000, BLOCK=BLOCK)


def _distinct(out: torch.Tensor) -> int:
    return int(out.view(PROGRAMS, BLOCK)[:, 0].unique().numel())


def test_kernels_on_a_partition_stay_on_its_sms() -> None:
    rt = require_rt()
    part = sm_partition("cuda:0", 16)
    assert part.sms == 16 and sm_partition("cuda:0", 13) is part  # rounded to Hopper's multiple of 8: one partition
    out = torch.zeros(PROGRAMS * BLOCK, dtype=torch.int32, device="cuda")
    ordinary = torch.cuda.Stream()
    with torch.cuda.stream(ordinary):
        _launch(out)
    ordinary.synchronize()
    assert _distinct(out) > part.sms  # the check can fail: unconstrained, the blocks spread wider

    out.zero_()
    with torch.cuda.stream(part.stream):
        _launch(out)
    part.stream.synchronize()
    assert 1 < _distinct(out) <= part.sms

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=part.stream):
        _launch(out)
    out.zero_()
    torch.cuda.synchronize()
    done = rt.Event(0, False)
    rt.graph_launch(0, int(graph.raw_cuda_graph_exec()), part.stream.cuda_stream)
    done.record(part.stream.cuda_stream)
    done.synchronize()
    assert 1 < _distinct(out) <= part.sms


@pytest.mark.parametrize("model", ["orpheus-tiny", "qwen3-tts-tiny"])
def test_rust_codec_on_a_partition_makes_the_same_audio(tmp_path: Path, model: str) -> None:
    """One GPU: `--codec-gpu 0` splits the replica into halves on cuda:0, `--codec-sms 16` puts the codec half's
    graphs on a 16-SM partition; the audio equals the whole engine's."""
    require_rt()
    whole, _ = cuda_bench_wavs("rust", tmp_path / "whole", model)
    partitioned, stderr = cuda_bench_wavs("rust", tmp_path / "part", model, "--codec-gpu", "0", "--codec-sms", "16")
    assert "SM partition of 16 of the" in stderr, stderr[-2000:]
    assert list(whole) == ["bench-000.wav", "bench-001.wav", "bench-002.wav"] and partitioned == whole

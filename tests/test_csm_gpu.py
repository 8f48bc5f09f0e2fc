"""GPU tier for CSM and Mimi (marker `gpu`, skipped without CUDA): the depth decoder's frame sampling and
Mimi's slot-pool decode captured as CUDA graphs equal eager runs; the full-size CSM-1B with dummy weights
generates in bfloat16 and its Mimi state fits the slot pool."""

from __future__ import annotations

import pytest
import torch
from csm_helpers import EagerGenerator, greedy

from vox_serve.codecs.slots import CodecSlots
from vox_serve.models.csm.layers import sample_frame
from vox_serve.models.csm.loader import CSM_1B_CONFIG, CSM_TINY_CONFIG, random_modules

pytestmark = pytest.mark.gpu


def capture(fn, warmup: int = 2) -> torch.cuda.CUDAGraph:  # noqa: ANN001
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


@pytest.mark.parametrize("config,dtype", [(CSM_TINY_CONFIG, torch.float32), (CSM_1B_CONFIG, torch.bfloat16)])
def test_frame_sampling_graph_equals_eager(config: dict, dtype: torch.dtype) -> None:
    m = random_modules(config, 64, seed=0, device="cuda").to(torch.device("cuda"), dtype)
    rows = 4
    m.depth.allocate(rows)
    hidden = torch.zeros(rows, m.config.backbone.hidden_size, device="cuda", dtype=dtype)
    out = torch.zeros(rows, m.config.num_codebooks, device="cuda", dtype=torch.int64)

    def run() -> None:
        out.copy_(sample_frame(m.backbone, m.depth, hidden, greedy))

    graph = capture(run)
    for seed in (1, 2):
        hidden.copy_(torch.randn(hidden.shape, generator=torch.Generator().manual_seed(seed)).to(hidden))
        graph.replay()
        got = out.clone()
        run()
        assert torch.equal(got, out)


@pytest.mark.parametrize("config,dtype", [(CSM_TINY_CONFIG, torch.float32), (CSM_1B_CONFIG, torch.bfloat16)])
def test_mimi_slot_decode_graph_equals_eager(config: dict, dtype: torch.dtype) -> None:
    """Two graph replays over slots [2, 0] equal two eager chunks over a second pool; a chunk of 2 frames."""
    dec = random_modules(config, 64, seed=0, device="cuda").codec.to("cuda", dtype)
    codes = torch.zeros(2, 2, 32, device="cuda", dtype=torch.int64)
    slots = torch.tensor([2, 0], device="cuda")
    graph_pool, eager_pool = CodecSlots(dec, 3), CodecSlots(dec, 3)
    pcm = torch.zeros(2, 2 * 1920, device="cuda", dtype=dtype)

    def run() -> None:
        pcm.copy_(graph_pool.decode_chunk(codes, slots))

    graph = capture(run)
    graph_pool.reset_slots(slots)
    for seed in (1, 2):
        codes.copy_(torch.randint(0, 2048, codes.shape, generator=torch.Generator().manual_seed(seed)))
        graph.replay()
        want = eager_pool.decode_chunk(codes, slots)
        tol = 1e-5 if dtype == torch.float32 else 1e-2  # the same kernels; bf16 allows a rounding step
        assert (pcm.float() - want.float()).abs().max().item() <= tol * max(1.0, want.float().abs().max().item())
    if config is CSM_1B_CONFIG:  # the real Mimi: 8 layers x 2 x 8 heads x 249 x 64 transformer state per slot
        assert graph_pool.state.shape[1] > 8 * 2 * 8 * 249 * 64
        print(f"Mimi state per slot: {graph_pool.state[0].numel() * graph_pool.state.element_size() / 2**20:.2f} MiB")


def test_full_size_generates_in_bfloat16() -> None:
    m = random_modules(CSM_1B_CONFIG, 256, seed=0, device="cuda").to(torch.device("cuda"), torch.bfloat16)
    prompts = [[[-1] * 32 + [t] for t in (128000, 58, 15, 60, 72, 105, 128001)]] * 2
    frames = EagerGenerator(m, max_len=256, max_rows=2).generate(prompts, 4)
    assert [len(f) for f in frames] == [4, 4] and frames[0] == frames[1]
    assert all(0 <= c < 2051 for f in frames[0] for c in f)

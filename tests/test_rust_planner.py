"""FlashInfer's planners compiled into the extension, run on the CPU (they are host code; the shim
answers their device queries from the properties it is given). Plans are checked against what
FlashInfer's scheduler (flashinfer/attention/scheduler.cuh) decides for small cases worked out by
hand; tests/test_gpu_rust.py compares them with FlashInfer's Python wrappers on a GPU."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
from rust_helpers import require_planner

INT_BYTES = 8 << 20


def _planner(num_kv_heads: int = 8, num_sm: int = 132, blocks_per_sm: int = 2, int_bytes: int = INT_BYTES,
             float_bytes: int = 128 << 20):  # noqa: ANN202
    rt = require_planner()
    return rt.Planner(num_sm=num_sm, cc_major=9, cc_minor=0, num_qo_heads=24, num_kv_heads=num_kv_heads, head_dim=128,
                      page_size=16, float_workspace_addr=1 << 30, float_workspace_bytes=float_bytes,
                      int_workspace_addr=2 << 30, int_workspace_bytes=int_bytes, decode_blocks_per_sm=blocks_per_sm)


def _ints(data: bytes, offset: int, count: int) -> list[int]:
    return np.frombuffer(data, dtype=np.int32, count=count, offset=offset).tolist()


def test_records_the_flashinfer_version_it_was_built_against() -> None:
    rt = require_planner()
    assert rt.flashinfer_version() == importlib.metadata.version("flashinfer-python")


def test_decode_plan_without_split() -> None:
    """3 sequences of 3, 7, 1 pages use 24 of 264 CTAs, and no sequence exceeds the 8-page minimum
    chunk: no split, one tile per request (DecodePlanInfo: padded batch, offsets, split flags)."""
    info, data = _planner().decode([0, 3, 10, 11], cuda_graph=False)
    padded, _, _, req_off, tile_off, o_off, _, chunk_off, graph, split = info
    assert (padded, graph, split) == (3, 0, 0)
    assert _ints(data, req_off, 3) == [0, 1, 2]
    assert _ints(data, tile_off, 3) == [0, 0, 0]
    assert _ints(data, o_off, 4) == [0, 1, 2, 3]
    assert _ints(data, chunk_off, 1) == [8 * 16]  # the chunk in tokens


def test_decode_plan_splits_a_long_sequence_under_a_graph() -> None:
    """One 300-page sequence with a CUDA graph: split across the grid (264 CTAs / 8 KV heads = 33
    padded rows), tiles of one chunk each, the unused rows masked off."""
    info, data = _planner().decode([0, 300], cuda_graph=True)
    padded, _, _, req_off, tile_off, o_off, mask_off, chunk_off, graph, split = info
    assert (padded, graph, split) == (33, 1, 1)
    chunk_pages = _ints(data, chunk_off, 1)[0] // 16
    tiles = -(-300 // chunk_pages)
    assert tiles <= padded
    assert _ints(data, req_off, tiles) == [0] * tiles
    assert _ints(data, tile_off, tiles) == list(range(tiles))
    assert _ints(data, o_off, 2) == [0, tiles]
    mask = np.frombuffer(data, dtype=np.uint8, count=padded, offset=mask_off).tolist()
    assert mask == [1] * tiles + [0] * (padded - tiles)


def test_prefill_plan() -> None:
    """Two prompts of 5 and 7 rows (GQA group 3: 15 and 21 packed rows, one 64-row tile each)."""
    info, data = _planner().prefill([0, 5, 12], [0, 1, 2], 12, cuda_graph=False)
    padded, total_rows, _, cta_tile_q, req_off, qo_tile_off, kv_tile_off, _, o_off = info[:9]
    assert (padded, total_rows, cta_tile_q, info[13], info[14]) == (2, 12, 64, 0, 0)
    assert _ints(data, req_off, 2) == [0, 1]
    assert _ints(data, qo_tile_off, 2) == [0, 0]
    assert _ints(data, kv_tile_off, 2) == [0, 0]
    assert _ints(data, o_off, 3) == [0, 5, 12]


def test_sm90_prefill_plan_spreads_work_over_every_cta() -> None:
    """FA3's planner: one work item per (head, query tile), balanced over the SMs' CTAs."""
    num_sm = 132
    info, data = _planner(num_sm=num_sm).prefill_sm90([0, 5, 12], [0, 1, 2], [5, 7], 12, causal=True)
    work_indptr = _ints(data, info[6], num_sm + 1)
    assert work_indptr[0] == 0 and work_indptr == sorted(work_indptr)
    assert work_indptr[-1] == 24 * 2  # 24 query heads x 2 sequences of one 128-row tile
    heads = _ints(data, info[5], work_indptr[-1])
    assert sorted(heads) == sorted(list(range(24)) * 2)


def test_planner_errors_come_back_as_value_errors() -> None:
    """FlashInfer's exceptions are caught in the C++ shim and returned with their message."""
    with pytest.raises(ValueError, match="should be divisible by num_kv_heads 7"):
        _planner(num_kv_heads=7).prefill([0, 1], [0, 1], 1)
    with pytest.raises(ValueError, match="Buffer overflow"):
        _planner(int_bytes=64, float_bytes=16).decode([0, 300], cuda_graph=True)
    planner = _planner()
    with pytest.raises(ValueError, match="never decrease"):
        planner.decode([0, 5, 3])
    with pytest.raises(ValueError, match="kv_indptr"):
        planner.prefill([0, 1, 2], [0, 1], 2)
    # A planner keeps working after a failed plan.
    assert planner.decode([0, 3, 10, 11])[0][0] == 3

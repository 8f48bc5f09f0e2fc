"""FlashInferAttentionBackend's host planning, on the CPU with a stand-in for the `flashinfer` module (the real one
needs CUDA; the GPU tier runs the real wrappers): a decode bucket that runs the planless Triton kernel is planned
once, at its first launch, and then no more, and the engine spec says its graph reads no plan; every other bucket is
planned at every launch, and each launch runs the kernel its bucket's plan was made for."""

from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

from vox_serve.rt.attention import triton_decode
from vox_serve.rt.attention.base import AttentionBuffers, AttentionPlan, PlanInputs

pytestmark = pytest.mark.skipif(triton_decode.triton is None, reason="Triton is not installed")


class FakeDecodeWrapper:
    """Counts its plans and runs; its output is all ones, so a launch it served is told apart."""

    def __init__(self, workspace: torch.Tensor, layout: str, **kwargs: object) -> None:
        self.plans = 0
        self._plan_info = None

    def plan(self, indptr: torch.Tensor, *args: object, **kwargs: object) -> None:
        self.plans += 1
        self._plan_info = [len(indptr) - 1]

    def run(self, q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(q)


class FakeEvent:
    def record(self) -> None: ...

    def synchronize(self) -> None: ...


@pytest.fixture
def backend_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = FakeDecodeWrapper
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.delitem(sys.modules, "vox_serve.rt.attention.flashinfer_backend", raising=False)
    module = importlib.import_module("vox_serve.rt.attention.flashinfer_backend")
    monkeypatch.setattr(module, "WORKSPACE_BYTES", 1024)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    # the geometry decision as on a CUDA device (the backend's device here is the CPU)
    real = triton_decode.serves_geometry
    monkeypatch.setattr(triton_decode, "serves_geometry", lambda **kw: real(**{**kw, "cuda": True}))
    # the Triton kernel's launch: all twos (its numerics are tests/test_decode_attention.py's)
    monkeypatch.setattr(triton_decode, "decode_attention", lambda q, *args: torch.full_like(q, 2.0))
    yield module
    sys.modules.pop("vox_serve.rt.attention.flashinfer_backend", None)


def make_backend(module: types.ModuleType, q_heads: int) -> object:
    backend = module.FlashInferAttentionBackend(num_layers=1, num_pages=8, page_size=16, num_q_heads=q_heads,
                                                num_kv_heads=8, head_dim=128, dtype=torch.float32, device="cpu")
    backend._triton_workspaces.of = lambda q: None  # (no CUDA device to size one for)
    return backend


def step(backend: object, rows: int) -> float:
    """Plan and run one decode launch of `rows` rows; the value its attention output holds."""
    inputs = PlanInputs(kv_indptr=torch.arange(rows + 1, dtype=torch.int32),
                        kv_last_page_len=torch.ones(rows, dtype=torch.int32), qo_indptr=None,
                        kv_indices=torch.zeros(8 * rows, dtype=torch.int32), max_pages_per_seq=8)
    backend.plan(AttentionPlan.decode_rows([1] * rows), inputs)
    bufs = AttentionBuffers(page_table=torch.zeros(rows, 8, dtype=torch.int32),
                            kv_lens=torch.ones(rows, dtype=torch.int32),
                            qo_indptr=torch.arange(rows + 1, dtype=torch.int32),
                            slot_mapping=torch.zeros(rows, dtype=torch.int64))
    q = torch.zeros(rows, backend.num_q_heads, 128)
    kv = torch.zeros(rows, 8, 128)
    return float(backend.forward(0, q, kv, kv, bufs).unique().item())


def plans(backend: object) -> dict[int, int]:
    return {rows: w.plans for rows, w in backend._decode.items()}


def test_a_triton_bucket_is_planned_once_and_published_as_reading_no_plan(backend_module: types.ModuleType) -> None:
    backend = make_backend(backend_module, q_heads=16)  # group 2: FlashInfer would decode on CUDA cores
    outputs = [step(backend, rows) for _ in range(3) for rows in (1, 2, 4)]
    assert outputs == [2.0, 2.0, 1.0] * 3  # 1-2 rows: the Triton kernel; 4: the wrapper
    assert plans(backend) == {1: 1, 2: 1, 4: 3}
    layout = backend.planner_layout()["decode"]
    assert {rows: entry["reads_plan"] for rows, entry in layout.items()} == {"1": False, "2": False, "4": True}
    assert layout["1"]["plan_info"] == [1]  # its first plan is there for a runtime to check against


def test_tensor_core_geometries_keep_planning_unless_the_kernel_serves_them(
        backend_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    orpheus = make_backend(backend_module, q_heads=24)  # group 3: FlashInfer's tensor-core decode
    assert [step(orpheus, 1) for _ in range(3)] == [1.0] * 3 and plans(orpheus) == {1: 3}
    assert orpheus.planner_layout()["decode"]["1"]["reads_plan"]
    monkeypatch.setenv(triton_decode.ENV, "all")
    forced = make_backend(backend_module, q_heads=24)
    assert [step(forced, 1) for _ in range(3)] == [2.0] * 3 and plans(forced) == {1: 1}


def test_wide_buckets_run_the_kernel_at_every_geometry(backend_module: types.ModuleType) -> None:
    """16-256 rows (triton_decode.WIDE_ROWS): the kernel, planned once, for a tensor-core geometry too."""
    orpheus = make_backend(backend_module, q_heads=24)
    outputs = [step(orpheus, rows) for _ in range(2) for rows in (8, 16, 256, 512)]
    assert outputs == [1.0, 2.0, 2.0, 1.0] * 2 and plans(orpheus) == {8: 2, 16: 1, 256: 1, 512: 2}
    layout = orpheus.planner_layout()["decode"]
    assert {rows: entry["reads_plan"] for rows, entry in layout.items()} == {
        "8": True, "16": False, "256": False, "512": True}


def test_switched_off_or_past_the_row_limit_every_launch_is_planned(
        backend_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(triton_decode.ENV, "0")
    off = make_backend(backend_module, q_heads=16)
    assert [step(off, 1) for _ in range(2)] == [1.0] * 2 and plans(off) == {1: 2}
    monkeypatch.setenv(triton_decode.ENV, "1")
    monkeypatch.setenv(triton_decode.ROWS_ENV, "4")
    wide = make_backend(backend_module, q_heads=16)
    assert [step(wide, 4) for _ in range(2)] == [2.0] * 2 and plans(wide) == {4: 1}

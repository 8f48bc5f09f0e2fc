"""rt.depth_step on the CPU: what it serves, the stacks it shares with the modules, its block and grid sizing (the
kernel itself: tests/triton_checks/check_ops.py under the interpreter, tests/test_gpu_kernels.py on a GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from decoder_stack_helpers import DIMS, ROPE
from torch import nn

from vox_serve.layers.depth import DepthTransformer
from vox_serve.rt import depth_step

pytestmark = pytest.mark.skipif(depth_step.triton is None, reason="triton not installed")


def _depth(in_proj: nn.Module) -> DepthTransformer:
    return DepthTransformer(dims=DIMS, in_proj=in_proj, num_positions=5, num_heads_out=4, rope=ROPE, qk_norm=True)


def test_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(depth_step.ENV, raising=False)
    depth = _depth(nn.Identity())
    depth.allocate(max_rows=2)
    assert depth._stacked is None  # CPU tensors, not forced: the step's own kernels
    monkeypatch.setenv(depth_step.ENV, "1")
    assert depth_step.prepare(depth) is None  # asked, but CPU tensors are served only when forced


def test_an_input_projection_it_cannot_run_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(depth_step, "forced", True)
    assert depth_step.prepare(_depth(nn.Sequential(nn.Linear(DIMS.hidden_size, DIMS.hidden_size)))) is None
    assert depth_step.prepare(_depth(nn.Linear(DIMS.hidden_size + 8, DIMS.hidden_size))) is not None


def test_the_stacks_are_the_modules_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layers' parameters become views of the stacks: one copy of the weights, the same values."""
    monkeypatch.setattr(depth_step, "forced", True)
    depth = _depth(nn.Identity())
    before = [la.gate_up_proj.weight.detach().clone() for la in depth.layers]
    stacked = depth_step.prepare(depth)
    for i, layer in enumerate(depth.layers):
        assert layer.gate_up_proj.weight.data_ptr() == stacked.gate_up[i].data_ptr()
        assert layer.q_norm.weight.data_ptr() == stacked.q_norm[i].data_ptr()
        assert torch.equal(layer.gate_up_proj.weight, before[i])
    assert stacked.qkv.shape == (DIMS.num_layers, (DIMS.num_heads + 2 * DIMS.num_kv_heads) * DIMS.head_dim,
                                 DIMS.hidden_size)


@pytest.mark.parametrize(("n", "k", "rows", "gated"), [(4096, 1024, 1, False), (1024, 3072, 4, False),
                                                        (3072, 1024, 2, True), (96, 80, 1, False)])
def test_blocks_bound_the_accumulator(n: int, k: int, rows: int, gated: bool) -> None:
    blocks = depth_step._blocks(n, k, rows, programs=264, gated=gated)
    bn, bk = blocks["BLOCK_N"], blocks["BLOCK_K"]
    assert bn & (bn - 1) == 0 and bk & (bk - 1) == 0 and 16 <= bk
    assert bn <= depth_step.settings.max_block_n and bk <= max(16, 2 * k)
    assert rows * bn * bk * (2 if gated else 1) <= max(depth_step.settings.acc_elements, rows * bn * 16 * 2)
    assert -(-n // bn) >= min(264, n) // 2  # about one column block per program


def _compiled(regs: int, warps: int, shared: int) -> SimpleNamespace:
    return SimpleNamespace(n_regs=regs, metadata=SimpleNamespace(num_warps=warps, shared=shared))


def test_resident_programs_per_sm(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H100/H200 SM: 64K registers, 228 KB of shared memory, 2048 threads."""
    props = SimpleNamespace(regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
                            max_threads_per_multi_processor=2048)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    assert depth_step._resident(_compiled(128, 4, 0), torch.device("cuda")) == 4  # registers
    assert depth_step._resident(_compiled(40, 4, 100_000), torch.device("cuda")) == 2  # shared memory
    assert depth_step._resident(_compiled(16, 8, 0), torch.device("cuda")) == 8  # threads
    assert depth_step._resident(_compiled(255, 32, 0), torch.device("cuda")) == 0  # not one


def test_more_rows_than_served_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rows (past MAX_ROWS) get None: the step's own kernels run."""
    monkeypatch.setattr(depth_step, "forced", True)
    depth = _depth(nn.Identity())
    depth.allocate(max_rows=2)
    tables = depth._tables(2, 1, 2, torch.device("cpu"))
    x = torch.randn(2, DIMS.hidden_size)
    assert depth_step.MAX_ROWS < 2
    assert depth_step.run(depth, depth._stacked, x, tables.slots, tables.positions, head=1) is None

"""rt.l2_prefetch on the CPU: what a layer prefetches within its budget, the strict setting, the kernel's sm_90 PTX
(the dry run of its address arithmetic runs under Triton's interpreter: tests/triton_checks/check_ops.py; the GPU
tier, tests/test_gpu.py, checks that a model's output does not change with the prefetches on)."""

from __future__ import annotations

import pytest
import torch
from sm90_helpers import sm90_ptx

from vox_serve.rt import l2_prefetch


def test_the_output_projection_goes_whole_then_an_equal_share_of_every_gate_up_row() -> None:
    o = torch.zeros(3072, 3072, dtype=torch.bfloat16)  # Orpheus-3B: 18 MiB
    gate_up = torch.zeros(16384, 3072, dtype=torch.bfloat16)  # 6144 bytes a row
    budget = 30 << 20
    head, tail = l2_prefetch.plan(o, gate_up, budget)
    assert head == l2_prefetch.Region(base=o.data_ptr(), rows=1, stride=0, row_bytes=18 << 20)
    share = (budget - (18 << 20)) // 16384 // l2_prefetch.LINE * l2_prefetch.LINE
    assert tail == l2_prefetch.Region(base=gate_up.data_ptr(), rows=16384, stride=6144, row_bytes=share)
    assert head.nbytes + tail.nbytes <= budget and share == 768


def test_what_does_not_fit_is_left_out() -> None:
    o, gate_up = torch.zeros(64, 64), torch.zeros(100, 64)  # float32: 16 KiB, then 256 bytes a row
    only_rows = l2_prefetch.plan(o, gate_up, budget=12_800)  # o does not fit: 128 bytes of every row
    assert only_rows == [l2_prefetch.Region(base=gate_up.data_ptr(), rows=100, stride=256, row_bytes=128)]
    assert l2_prefetch.plan(o, gate_up, budget=16_384 + 12_700) == [l2_prefetch.whole(o)]  # < a line a row
    assert l2_prefetch.plan(o, gate_up, budget=1 << 30)[1].row_bytes == 256  # at most the whole row


def test_regions_need_contiguous_weights() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        l2_prefetch.whole(torch.zeros(8, 8).t())
    with pytest.raises(ValueError, match="2-D"):
        l2_prefetch.leading(torch.zeros(8), 128)


@pytest.mark.parametrize("value", ["yes", "2", "auto"])
def test_a_bad_setting_is_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(l2_prefetch, "_setting_cache", {})
    monkeypatch.setenv(l2_prefetch.ENV, value)
    with pytest.raises(ValueError, match=l2_prefetch.ENV):
        l2_prefetch.budget(torch.zeros(1, 8))


@pytest.mark.parametrize("value", ["", "0", "1"])
def test_cpu_tensors_get_no_budget(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(l2_prefetch, "_setting_cache", {})
    monkeypatch.setenv(l2_prefetch.ENV, value)
    assert l2_prefetch.budget(torch.zeros(1, 8)) == 0
    assert l2_prefetch.issue(torch.zeros(1, 8), []) is None


def test_the_kernel_issues_bulk_l2_prefetches_for_sm90() -> None:
    kernel = l2_prefetch._prefetch_kernel
    types = {"out_ptr": "*i64", "base": "i64", "rows": "i32", "stride": "i64", "row_bytes": "i32",
             "chunks_per_row": "i32"}
    constexprs = dict(CHUNK=l2_prefetch.CHUNK, BLOCK=l2_prefetch.BLOCK)
    ptx = sm90_ptx(kernel, types, constexprs | {"DRY": False})
    assert ptx.count("cp.async.bulk.prefetch.L2.global") >= 1
    assert "st.global" not in ptx  # prefetches only: nothing is written
    dry = sm90_ptx(kernel, types, constexprs | {"DRY": True})
    assert "cp.async.bulk.prefetch" not in dry and "st.global" in dry

"""rt.pdl's switch on the CPU: the setting is parsed strictly and nothing but a CUDA tensor's launch takes part
(the GPU tier, tests/test_gpu_kernels.py, checks the launches themselves inside a CUDA graph)."""

from __future__ import annotations

import pytest
import torch

from vox_serve.rt import pdl


@pytest.mark.parametrize("value", ["", "0", "1", "auto", " AUTO "])
def test_cpu_tensors_never_take_part(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pdl.ENV, value)
    assert pdl.launch_options(torch.zeros(1)) == {"PDL": False}


def test_on_where_it_applies_unless_asked_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pdl.ENV, raising=False)
    assert pdl._setting() == "auto"


@pytest.mark.parametrize("value", ["yes", "2", "on"])
def test_a_bad_setting_is_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pdl.ENV, value)
    with pytest.raises(ValueError, match="VOX_PDL"):
        pdl.launch_options(torch.zeros(1))


def _sm90_ptx(prefetch: bool, pdl_on: bool = True) -> str:
    """rt.small_gemm's kernel compiled for sm_90 without a GPU (Triton's own ptxas), gated, K = 1024."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vox_serve.rt import small_gemm

    pointers = ("x_ptr", "d_ptr", "nw_ptr", "sum_ptr", "w_ptr", "b_ptr", "out_ptr")
    constexprs = dict(K=1024, HAS_DELTA=False, NORM=True, GATED=True, GATED_IN=False, HAS_BIAS=False, DOT=False,
                      UNROLL=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=256, PREFETCH=prefetch, LINE=64, LINES=16,
                      PDL=pdl_on)
    signature = {name: "*bf16" for name in pointers} | {"m": "i32", "N": "i32", "eps": "fp32"}
    signature |= {name: "constexpr" for name in constexprs}
    source = ASTSource(fn=small_gemm._small_linear_kernel, signature=signature, constexprs=constexprs)
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl_on})
    except Exception as e:  # noqa: BLE001 - a Triton build without the NVIDIA backend's tools
        pytest.skip(f"no sm_90 compilation here: {e}")
    return compiled.asm["ptx"]


def test_kernels_wait_for_the_one_before_and_prefetch_only_ahead_of_that() -> None:
    """The compiled PTX: with PDL the kernel waits (griddepcontrol.wait) before its first load of an input and
    then lets the next kernel launch; with the prefetch its L2 prefetches come before the wait; without PDL none
    of it is emitted."""
    ptx = _sm90_ptx(prefetch=True)
    wait = ptx.index("griddepcontrol.wait")
    assert wait < ptx.index("griddepcontrol.launch_dependents")
    assert "prefetch.global.L2::evict_last" in ptx[:wait]
    assert "ld.global" not in ptx[:wait]
    assert "prefetch.global" not in _sm90_ptx(prefetch=False)
    plain = _sm90_ptx(prefetch=False, pdl_on=False)
    assert "griddepcontrol" not in plain and "prefetch.global" not in plain


def test_prefetch_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    weights = torch.zeros(4, 4)
    monkeypatch.delenv(pdl.PREFETCH_ENV, raising=False)
    assert not pdl.prefetches(torch.zeros(1), weights)
    monkeypatch.setenv(pdl.PREFETCH_ENV, "1")
    assert not pdl.prefetches(torch.zeros(1), weights)  # never without PDL (CPU tensors: never)

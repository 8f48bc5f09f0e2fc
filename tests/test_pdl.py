"""rt.pdl on the CPU: the setting is parsed strictly, nothing but a CUDA tensor's launch takes part, and every
participating kernel's sm_90 PTX keeps the contract (the GPU tier, tests/test_gpu_kernels.py, checks the launches
themselves inside a CUDA graph)."""

from __future__ import annotations

import importlib
from pathlib import Path

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


def _sm90_ptx(kernel, types: dict[str, str], constexprs: dict, pdl_on: bool = True) -> str:  # noqa: ANN001
    """A Triton kernel compiled for sm_90 without a GPU (Triton's own ptxas): its PTX. `types` gives every
    runtime parameter's type ("*bf16", "i32", ...)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = {**constexprs, "PDL": pdl_on}
    signature = {name: types[name] if name in types else "constexpr" for name in kernel.arg_names}
    missing = [name for name, kind in signature.items() if kind == "constexpr" and name not in constexprs]
    assert not missing, missing
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl_on})
    except Exception as e:  # noqa: BLE001 - a Triton build without the NVIDIA backend's tools
        pytest.skip(f"no sm_90 compilation here: {e}")
    return compiled.asm["ptx"]


def _types(pointers: str, scalars: str = "", **pointer_types: str) -> dict[str, str]:
    """Space-separated names: bf16 pointers and i32 scalars; keyword arguments: other pointer types."""
    out = {name: "*bf16" for name in pointers.split()} | {name: "i32" for name in scalars.split()}
    return out | {name: f"*{t}" for name, t in pointer_types.items()}


def _gemm(float8: bool = False) -> tuple:
    """The small-rows projection kernel; `float8`: over a float8 weight with its scales (`--quantization fp8`)."""
    from vox_serve.rt import small_gemm

    types = _types("x_ptr d_ptr nw_ptr sum_ptr w_ptr b_ptr out_ptr", "m N", s_ptr="fp32") | {"eps": "fp32"}
    if float8:
        types["w_ptr"] = "*fp8e4nv"
    return small_gemm._small_linear_kernel, types, dict(
        K=1024, HAS_DELTA=False, NORM=True, GATED=True, GATED_IN=False, HAS_BIAS=False, SCALED=float8, DOT=False,
        UNROLL=False, BLOCK_M=1, BLOCK_N=8, BLOCK_K=256)


def _participants() -> list[tuple]:
    """Every kernel of the step launched with PDL, with parameter types and constexprs to compile it."""
    from vox_serve.core.request import OutKind
    from vox_serve.models.orpheus import step_kernels
    from vox_serve.rt import depth_attention, launch_rows, slot_head, triton_ops

    rows_in = dict(slot_in="i32", pos_in="i32", ids_in="i32", kv_indptr="i32", prompt_len="i64", rep_window="i64",
                   num_codes="i64", tokens="i32", page_table="i32", temperature="fp32", top_k="i64", top_p="fp32",
                   min_p="fp32", penalty="fp32", seed="i64", allow_stop="i1")
    rows_out = {f"{name}_out": kind for name, kind in rows_in.items() if name not in (
        "slot_in", "pos_in", "ids_in", "kv_indptr", "prompt_len", "rep_window", "tokens", "page_table")}
    rows_out |= dict(slot_out="i64", pos_out="i64", kv_len_out="i32", qo_indptr_out="i32", gen_out="i64",
                     ids_out="i64", page_rows_out="i32", slot_mapping_out="i64", logits_index_out="i64",
                     history_out="i64", kv_indices_out="i32")
    return [
        _gemm(),
        _gemm(float8=True),
        (triton_ops._add_rms_norm_kernel, _types("x_ptr delta_ptr weight_ptr sum_ptr", "width", out_ptr="fp8e4nv",
                                                 scale_ptr="fp32") | {"eps": "fp32"}, dict(BLOCK=1024, FP8=True)),
        (triton_ops._silu_mul_kernel, _types("x_ptr out_ptr", "total width"), dict(BLOCK=1024)),
        (triton_ops._silu_mul_fp8_kernel, _types("x_ptr", "width", out_ptr="fp8e4nv", scale_ptr="fp32"),
         dict(BLOCK=8192)),
        (triton_ops._rope_write_kv_kernel,
         _types("q_ptr k_ptr v_ptr q_out_ptr kc_ptr vc_ptr qw_ptr kw_ptr", "q_heads sq_t sq_h sk_t sk_h sv_t sv_h "
                "table_stride page_size c_page c_tok c_head", slot_ptr="i64", pos_ptr="i64", cos_ptr="fp32",
                sin_ptr="fp32") | {"eps": "fp32"}, dict(ROTATE=True, HAS_NORM=True, HALF=64, BLOCK=64, SATURATE=False)),
        (slot_head._slot_logits_kernel, _types("h_ptr w_ptr", "m base extra_id", slot_ptr="i64", out_ptr="fp32"),
         dict(K=3072, WIDTH=4096, BLOCKS=64, NUM_SLOTS=7, DOT=False, IEEE=False, BLOCK_M=1, BLOCK_N=64, BLOCK_K=64)),
        (launch_rows._decode_rows_kernel,
         _types("", "n scratch max_generated page_size ids_stride tok_s tok_g", **rows_in, **rows_out),
         dict(COLUMNS=1, CPS=1, WIDTH=72, WINDOW=64, C_BLOCK=1, P_BLOCK=128, W_BLOCK=64, HAS_KV_INDICES=True,
              ABSENT=-1)),
        (launch_rows._commit_kernel,
         _types("", "scratch max_generated max_codes tok_stride code_stride st_s st_g codes_s", tok_in="i64",
                codes_in="i64", kind_in="i64", write_slot="i64", gen_index="i64", num_codes="i64", tokens="i32",
                codes="i32", num_codes_table="i64", kind_out="i32"),
         dict(TOK_W=1, CODE_W=1, T_BLOCK=1, C_BLOCK=1, AUDIO=int(OutKind.AUDIO), AUDIO_STOP=int(OutKind.AUDIO_STOP))),
        (step_kernels._constrain_kernel, _types("", "row_stride", logits="fp32", history="i64", slot_ptr="i64",
                                                allow_stop="i1", local_out="i64"),
         dict(W=64, W_BLOCK=64, AUDIO_START=128266, CODES=4096, STOP=128258)),
        (step_kernels._emit_kernel, _types("", "n", cand_ptr="i64", slot_ptr="i64", token_out="i64", code_out="i64",
                                           kind_out="i64"),
         dict(AUDIO_START=128266, CODES=4096, STOP=128258, STOP_KIND=int(OutKind.STOP), AUDIO=int(OutKind.AUDIO),
              OTHER=int(OutKind.OTHER), BLOCK=256)),
        (depth_attention._depth_attention_kernel,
         _types("q_ptr k_ptr v_ptr out_ptr kc_ptr vc_ptr qw_ptr kw_ptr", "sq_t sq_h sk_t sk_h sv_t sv_h table_stride",
                slot_ptr="i64", pos_ptr="i64", cos_ptr="fp32", sin_ptr="fp32") | {"scale": "fp32", "eps": "fp32"},
         dict(N=1, G=2, HKV=8, POSITIONS=17, P_PAD=32, HAS_NORM=True, HALF=64, BLOCK=64)),
    ]


@pytest.mark.parametrize("index", range(12))
def test_every_participating_kernel_waits_before_it_touches_memory(index: int) -> None:
    """The PDL contract in the compiled PTX of each kernel launched with it: griddepcontrol.wait comes before its
    first global load, store or atomic, and the next kernel is let launch only after that wait. Compiled without
    PDL, none of it is emitted."""
    kernel, types, constexprs = _participants()[index]
    ptx = _sm90_ptx(kernel, types, constexprs)
    wait = ptx.index("griddepcontrol.wait")
    assert wait < ptx.index("griddepcontrol.launch_dependents")
    for op in ("ld.global", "st.global", "atom.global", "red.global"):
        assert op not in ptx[:wait], (kernel.__name__, op)
    assert "griddepcontrol" not in _sm90_ptx(kernel, types, constexprs, pdl_on=False)


def test_the_participants_are_every_kernel_with_a_pdl_parameter() -> None:
    """A kernel given the PDL constexpr is launched with PDL on Hopper: the test above must cover it. The modules
    searched are every one of the package that calls pdl.enter."""
    triton = pytest.importorskip("triton")
    package = Path(pdl.__file__).resolve().parents[1]
    names = sorted(".".join(("vox_serve", *f.relative_to(package).with_suffix("").parts))
                   for f in package.rglob("*.py") if "pdl.enter(" in f.read_text())
    assert len(names) >= 6, names
    modules = [importlib.import_module(name) for name in names]
    kernels = {v for m in modules for v in vars(m).values()
               if isinstance(v, triton.runtime.jit.JITFunction) and "PDL" in v.arg_names and v is not pdl.enter}
    assert kernels == {k for k, _, _ in _participants()}
    assert len(_participants()) == 12  # the parametrization above: every one

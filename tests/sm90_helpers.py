"""Triton kernels compiled for sm_90 on a machine without a GPU (Triton's own ptxas), to read their PTX."""

from __future__ import annotations

import pytest


def sm90_ptx(kernel, types: dict[str, str], constexprs: dict, pdl_on: bool = True) -> str:  # noqa: ANN001
    """A Triton kernel's PTX for sm_90. `types` gives every runtime parameter's type ("*bf16", "i32", ...);
    a kernel with a `PDL` constexpr gets `pdl_on` for it and for the launch option."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "PDL" in kernel.arg_names:
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

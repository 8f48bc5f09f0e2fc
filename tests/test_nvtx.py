"""--enable-nvtx: parsed into the engine config, and ranges pushed/popped around the block."""

from __future__ import annotations

import pytest
import torch

from vox_serve.cli import build_config, check_flags, given_flags
from vox_serve.rt.nvtx import nvtx_range


def test_flag_reaches_the_engine_config() -> None:
    kept, _ = check_flags(given_flags(["--enable-nvtx"]), "python", rust_missing=True)
    assert build_config(kept, "python").engine.enable_nvtx
    kept, _ = check_flags(given_flags([]), "python", rust_missing=True)
    assert not build_config(kept, "python").engine.enable_nvtx


def test_ranges_balanced_even_when_the_block_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(f"push {name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    with nvtx_range("decode[8]", True):
        calls.append("body")
    with pytest.raises(RuntimeError), nvtx_range("codec[4]", True):
        raise RuntimeError("stage failed")
    with nvtx_range("schedule", False):
        calls.append("untraced")
    assert calls == ["push decode[8]", "body", "pop", "push codec[4]", "pop", "untraced"]

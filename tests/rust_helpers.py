"""The Rust extension in tests: `require_rt()` returns `vox_serve._rt` or skips the test.

VOX_REQUIRE_RT=1 (CI, whose install builds the extension) turns a missing extension into a
failure; VOX_REQUIRE_RT=cuda also fails when its CUDA parts (built only with nvcc, the planner
also only with flashinfer-python's headers) are missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _fail_or_skip(why: str, cuda_part: bool) -> None:
    required = os.environ.get("VOX_REQUIRE_RT", "")
    if required == "cuda" or (required == "1" and not cuda_part):
        pytest.fail(f"required by VOX_REQUIRE_RT={required}: {why}")
    pytest.skip(why)


def require_rt() -> ModuleType:
    try:
        from vox_serve import _rt
    except ImportError as exc:
        _fail_or_skip(f"vox_serve._rt is not built ({exc}); run `pip install -e .` with cargo installed", False)
    return _rt


def require_kernels() -> ModuleType:
    rt = require_rt()
    if not rt.kernels_embedded():
        _fail_or_skip("vox_serve._rt was built without nvcc: no sampling kernels", True)
    return rt


def require_planner() -> ModuleType:
    rt = require_rt()
    if not rt.planner_available():
        _fail_or_skip("vox_serve._rt was built without nvcc or flashinfer-python's headers: no planner", True)
    return rt


def cuda_bench_wavs(runtime: str, out: Path, model: str, *extra: str,
                    requests: int = 3) -> tuple[dict[str, bytes], str]:
    """(the WAVs by name, stderr) of `requests` greedy bench requests of 70 tokens on CUDA (batches of up to 8;
    `extra` flags come last, so they may override that)."""
    cmd = [sys.executable, "-m", "vox_serve.launch", "--runtime", runtime, "--model", model, "--device", "cuda",
           "--bench-requests", str(requests), "--greedy", "--bench-out", str(out), "--max-batch-size", "8",
           "--max-codec-batch", "8", "--bench-kwargs", '{"max_tokens": 70, "ignore_eos": true}', *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {f.name: f.read_bytes() for f in sorted(out.glob("*.wav"))}, proc.stderr

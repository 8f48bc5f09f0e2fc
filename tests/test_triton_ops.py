"""The fused Triton kernels (used on GPUs) equal their PyTorch references, run on the CPU through
Triton's interpreter. The interpreter is chosen when Triton is imported, so each check runs in a
fresh interpreter process with TRITON_INTERPRET=1."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")


@pytest.mark.parametrize("check", ["hash", "snake", "rope", "silu_mul", "add_rms_norm", "depthwise", "pointwise",
                                   "conv_gemm", "folded_conv", "transpose_gemm", "conv_to_one", "codecs", "sample",
                                   "rope_write_kv", "depth_attention", "decoder_stack", "depth_step", "small_gemm",
                                   "small_gemm_fp8", "quantize_rows", "quantized_inputs", "scaled_mm",
                                   "decode_rows", "commit_rows", "orpheus_step"])
def test_fused_kernel_equals_reference(check: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "triton_checks" / "check_ops.py"), check],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]

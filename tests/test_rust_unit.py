"""The Rust crate's own unit tests (`cargo test`): the scheduler's pools and chunking, the tokenizer,
the step writer, and FlashInfer launch planning against the compiled-in planners."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

RUST = Path(__file__).resolve().parents[1] / "rust"


def test_cargo_unit_tests_pass() -> None:
    if shutil.which("cargo") is None:
        if os.environ.get("VOX_REQUIRE_RT") == "1":
            pytest.fail("cargo is not installed (VOX_REQUIRE_RT=1)")
        pytest.skip("cargo is not installed")
    # Without the extension-module feature the test binary links libpython itself.
    proc = subprocess.run(["cargo", "test", "--release", "--no-default-features", "--lib", "-q"], cwd=RUST,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "test result: ok" in proc.stdout
    if os.environ.get("VOX_REQUIRE_RT") == "1":  # the planner tests ran (the shim was compiled in)
        assert "attention_plan" in subprocess.run(
            ["cargo", "test", "--release", "--no-default-features", "--lib", "--", "--list"], cwd=RUST,
            capture_output=True, text=True, timeout=600).stdout

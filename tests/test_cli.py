"""CLI and runtime selection: flags parsed once into frozen config; unimplemented flags rejected."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from vox_serve.cli import CliError, build_config, check_flags, given_flags
from vox_serve.launch import main, rust_unavailable_reason


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vox_serve.launch", *args], capture_output=True, text=True,
                          timeout=120)


def test_auto_falls_back_to_python_and_says_why() -> None:
    proc = _run("--model", "no-such-model-xyz", "--device", "cpu", "--bench-requests", "1")
    assert "serving with the Python runtime" in proc.stderr
    assert rust_unavailable_reason() in proc.stderr


def test_runtime_rust_exits_nonzero_with_reason() -> None:
    proc = _run("--runtime", "rust", "--model", "orpheus-tiny")
    assert proc.returncode != 0
    assert rust_unavailable_reason() in proc.stderr


def test_rust_reason_names_what_is_missing() -> None:
    """Without the extension: not installed; with this build of it: no serving entry point yet."""
    try:
        import vox_serve._rt  # noqa: F401
    except ImportError:
        assert rust_unavailable_reason() == "the Rust runtime extension vox_serve._rt is not installed"
    else:
        assert "has no serving entry point" in rust_unavailable_reason()


def test_python_help_lists_python_flags_only() -> None:
    proc = _run("--runtime", "python", "--help")
    assert proc.returncode == 0
    for flag in ("--bench-requests", "--disable-cuda-graph", "--max-batch-size", "--greedy"):
        assert flag in proc.stdout
    assert "--urgent-lane" not in proc.stdout


def test_rust_only_flag_dropped_with_warning_on_fallback() -> None:
    kept, warnings = check_flags(given_flags(["--urgent-lane", "--model", "x"]), "python", rust_missing=True)
    assert "urgent_lane" not in kept
    assert any("--urgent-lane" in w for w in warnings)


def test_rust_only_flag_rejected_when_python_is_explicit() -> None:
    with pytest.raises(CliError, match="--urgent-lane"):
        check_flags(given_flags(["--urgent-lane"]), "python", rust_missing=False)


def test_unimplemented_flag_rejected_clearly() -> None:
    with pytest.raises(CliError, match="not implemented yet"):
        check_flags(given_flags(["--enable-disaggregation"]), "python", rust_missing=True)
    assert main(["--runtime", "python", "--enable-disaggregation"]) == 2


@pytest.mark.parametrize("argv,match", [
    (["--bench-kwargs", "{not json"], "not valid JSON"),
    (["--bench-kwargs", "[1]"], "JSON object"),
    (["--max-batch-size", "0"], "must be >= 1"),
    (["--gpu-memory-utilization", "1.5"], r"\(0, 1\]"),
    (["--scheduler-type", "bogus"], "expected one of"),
])
def test_bad_values_rejected(argv: list[str], match: str) -> None:
    with pytest.raises(CliError, match=match):
        check_flags(given_flags(argv), "python", rust_missing=True)


def test_config_is_frozen_and_complete() -> None:
    kept, _ = check_flags(given_flags(["--model", "orpheus-tiny", "--max-batch-size", "8", "--greedy",
                                       "--bench-requests", "3", "--page-size", "32"]), "python", True)
    config = build_config(kept, "python")
    assert config.model.model == "orpheus-tiny"
    assert config.scheduler.max_batch_size == 8
    assert config.cache.page_size == 32
    assert config.bench.greedy and config.bench.num_requests == 3
    assert config.model.load_format == "auto"  # untouched flags keep their defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.scheduler.max_batch_size = 4  # type: ignore[misc]


def test_unknown_model_fails_cleanly() -> None:
    proc = _run("--model", "no-such-model-xyz", "--device", "cpu", "--bench-requests", "1")
    assert proc.returncode != 0
    assert "unknown model" in proc.stderr
    assert "Traceback" not in proc.stderr

"""CLI and runtime selection: flags parsed once into frozen config; unimplemented flags rejected."""

from __future__ import annotations

import dataclasses
import re
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
    """Without the extension: not installed; with this build of it: bench mode only (no HTTP server yet)."""
    try:
        import vox_serve._rt  # noqa: F401
    except ImportError:
        assert rust_unavailable_reason() == "the Rust runtime extension vox_serve._rt is not installed"
    else:
        assert "serves bench mode (--bench-requests N) only" in rust_unavailable_reason()
        assert rust_unavailable_reason(bench=True) is None


def test_python_help_lists_python_flags_only() -> None:
    proc = _run("--runtime", "python", "--help")
    assert proc.returncode == 0
    for flag in ("--bench-requests", "--disable-cuda-graph", "--max-batch-size", "--greedy"):
        assert flag in proc.stdout
    assert "--urgent-lane" not in proc.stdout


def test_rust_only_flag_dropped_with_warning_on_fallback() -> None:
    kept, warnings = check_flags(given_flags(["--urgent-lane", "--model", "orpheus-tiny"]), "python", rust_missing=True)
    assert "urgent_lane" not in kept
    assert any("--urgent-lane" in w for w in warnings)


def test_rust_only_flag_rejected_when_python_is_explicit() -> None:
    with pytest.raises(CliError, match="--urgent-lane"):
        check_flags(given_flags(["--urgent-lane"]), "python", rust_missing=False)


def test_unimplemented_flag_rejected_clearly() -> None:
    for flag in (["--sm-modes", "32"], ["--urgent-lane"]):
        with pytest.raises(CliError, match=f"{flag[0]} is not implemented yet in the rust runtime$"):
            check_flags(given_flags(flag), "rust", rust_missing=False)
    assert main(["--runtime", "rust", "--sm-modes", "32", "--bench-requests", "1"]) == 2


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


@pytest.mark.parametrize("argv,match", [
    (["--device", "gpu"], r"--device 'gpu': expected auto, cpu, cuda or cuda:N \(a GPU is --device cuda"),
    (["--device", "cuda:x"], "expected auto, cpu, cuda or cuda:N"),
    (["--port", "99999"], "--port 99999: must be 1 to 65535"),
    (["--port", "0"], "must be 1 to 65535"),
    (["--model", "orpheus-tin"], "unknown model 'orpheus-tin': did you mean orpheus-tiny"),
    (["--model", "qwen3-tts-tny"], "did you mean qwen3-tts-tiny"),
    (["--bench-requests", "0"], r"--bench-requests 0: must be >= 1 \(leave the flag out to serve HTTP\)"),
    (["--max-connections", "0"], "--max-connections must be >= 1"),
    (["--header-timeout-s", "0"], "--header-timeout-s must be > 0"),
    (["--api-key", " "], "--api-key must not be empty"),
])
def test_rough_command_lines_get_a_clear_error(argv: list[str], match: str) -> None:
    """Issue 10: these ended in tracebacks, built the 3B model with random weights for a typo, or
    silently served HTTP."""
    with pytest.raises(CliError, match=match):
        check_flags(given_flags(argv), "python", rust_missing=True)


def test_rough_command_lines_exit_2_without_a_traceback() -> None:
    for argv in (["--device", "gpu", "--bench-requests", "1"], ["--port", "99999"], ["--model", "orpheus-tin"]):
        proc = _run(*argv)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and "error:" in proc.stderr, proc.stderr


def test_model_names_checkpoint_dirs_and_hub_ids_are_taken(tmp_path) -> None:  # noqa: ANN001
    for name in ("orpheus-tiny", "qwen3-tts-base-0.6b", "Qwen/Qwen3-TTS-12Hz-1.7B-Base", str(tmp_path)):
        check_flags(given_flags(["--model", name]), "python", rust_missing=True)


def test_model_help_lists_every_registry_name() -> None:
    from vox_serve.models.names import NAMES

    proc = _run("--runtime", "python", "--help")
    help_text = re.sub(r"-\s+", "-", proc.stdout)  # argparse wraps lines at hyphens
    assert all(name in help_text for name in NAMES), help_text


def test_version_and_runtime_rust_next_step() -> None:
    from vox_serve import __version__

    proc = _run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"vox-serve {__version__}"
    proc = _run("--runtime", "rust", "--model", "orpheus-tiny")
    # Without the extension the next step is building it; with it, bench mode (HTTP is the next issue).
    next_step = "pip install -e ." if rust_unavailable_reason(bench=True) else "add --bench-requests N"
    assert proc.returncode == 2 and next_step in proc.stderr and "--runtime python" in proc.stderr


def test_server_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--header-timeout-s", "3", "--body-timeout-s", "4", "--max-connections", "9", "--allowed-origins",
            "http://a.example, http://b.example", "--max-batch-size", "5", "--session-idle-timeout-s", "7"]
    monkeypatch.delenv("VOX_SERVE_API_KEY", raising=False)
    server = build_config(check_flags(given_flags(argv), "python", True)[0], "python").server
    assert (server.header_timeout_s, server.body_timeout_s, server.max_connections) == (3, 4, 9)
    assert server.allowed_origins == ("http://a.example", "http://b.example") and server.api_key is None
    assert server.max_sessions == 5 and server.session_idle_timeout_s == 7  # sessions default to the batch
    monkeypatch.setenv("VOX_SERVE_API_KEY", "from-env")
    assert build_config({}, "python").server.api_key == "from-env"
    assert build_config({"api_key": "flag"}, "python").server.api_key == "flag"


def test_every_config_field_is_one_flag_and_no_flags_give_the_dataclass_defaults() -> None:
    """Defaults live in vox_serve/config.py only: the flags take theirs from the fields they set."""
    import dataclasses

    from vox_serve.cli import FLAGS, SECTIONS
    from vox_serve.config import ServerConfig, VoxConfig

    targets = [f.target for f in FLAGS if f.target is not None]
    assert len(targets) == len(set(targets))
    assert set(targets) == {(section, f.name) for _, section in SECTIONS for f in dataclasses.fields(section)}
    defaults = VoxConfig(runtime="python", server=ServerConfig(max_sessions=64))  # --max-batch-size's default
    assert build_config({}, "python") == defaults

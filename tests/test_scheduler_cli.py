"""The scheduling flags: every policy, --async-scheduling, --trace-dir and --deadline-* (Python runtime)."""

from __future__ import annotations

import pytest

from vox_serve.cli import CliError, build_config, check_flags, given_flags


def _config(*argv: str):  # noqa: ANN202
    kept, warnings = check_flags(given_flags(list(argv)), "python", rust_missing=False)
    assert not warnings
    return build_config(kept, "python").scheduler


@pytest.mark.parametrize("name", ["base", "online", "offline", "deadline"])
def test_every_policy_is_accepted(name: str) -> None:
    assert _config("--scheduler-type", name).scheduler_type == name


def test_input_streaming_is_a_name_of_base() -> None:
    assert _config("--scheduler-type", "input_streaming").scheduler_type == "base"


def test_async_scheduling_trace_dir_and_deadline_flags_reach_the_config() -> None:
    cfg = _config("--async-scheduling", "--trace-dir", "/tmp/t", "--deadline-startup-ms", "250",
                  "--deadline-max-prefill-deferral-ms", "80", "--deadline-lm-step-ms", "6.5",
                  "--deadline-codec-ms", "1.5", "--deadline-prefill-ms", "12")
    assert cfg.async_scheduling and cfg.trace_dir == "/tmp/t"
    assert (cfg.deadline_startup_ms, cfg.deadline_max_prefill_deferral_ms, cfg.deadline_lm_step_ms,
            cfg.deadline_codec_ms, cfg.deadline_prefill_ms) == (250, 80, 6.5, 1.5, 12)
    assert not _config().async_scheduling


def test_negative_deadline_estimates_are_rejected() -> None:
    with pytest.raises(CliError, match="--deadline-codec-ms must be >= 0"):
        _config("--deadline-codec-ms", "-1")

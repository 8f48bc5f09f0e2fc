"""`vox-serve` entry point: pick the runtime, parse its flags, then serve or benchmark."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

from vox_serve import __version__
from vox_serve.cli import (
    PY,
    RS,
    CliError,
    build_config,
    build_parser,
    check_flags,
    given_flags,
    python_only_flags,
    warn,
)

RUST_NEXT_STEP = ("To build it, install a Rust toolchain (cargo) and the CUDA 12 toolkit (nvcc, found through "
                  "CUDA_HOME), then run `pip install -e .` again; or serve now with --runtime python")


RUST_BENCH_ONLY = ("the Rust runtime extension vox_serve._rt serves bench mode (--bench-requests N) only in this "
                   "build; serving over HTTP comes with its HTTP server")


def rust_unavailable_reason(bench: bool = False) -> str | None:
    """Why the Rust runtime cannot serve this (None when its extension loads and serves it): bench mode
    needs the serving entry point, serving over HTTP also the Rust HTTP server (`SERVES_HTTP`)."""
    try:
        rt = importlib.import_module("vox_serve._rt")
    except ModuleNotFoundError:
        return "the Rust runtime extension vox_serve._rt is not installed"
    except Exception as exc:  # a broken build: report, never crash the fallback
        return f"the Rust runtime extension vox_serve._rt does not load: {exc}"
    if not callable(getattr(rt, "serve", None)):
        # The extension's foundation (kernels, planner, prompt builders) exists; its engine driver does not yet.
        return "the Rust runtime extension vox_serve._rt has no serving entry point in this build"
    if not bench and not getattr(rt, "SERVES_HTTP", False):
        return RUST_BENCH_ONLY
    return None


def _requested_runtime(argv: list[str]) -> tuple[str, bool]:
    """(--runtime, whether bench mode is asked for: --bench-requests, or a flag that needs it, which
    check_flags then refuses by name)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--runtime", choices=["auto", PY, RS], default="auto")
    pre.add_argument("--bench-requests", type=int, default=0)
    pre.add_argument("--bench-rate", default=None)
    pre.add_argument("--bench-json", default=None)
    known, _ = pre.parse_known_args(argv)
    return known.runtime, known.bench_requests > 0 or known.bench_rate is not None or known.bench_json is not None


def select_runtime(requested: str, bench: bool = False) -> tuple[str, str | None]:
    """(runtime, reason printed on stderr) for --runtime auto|python|rust. `auto` takes Rust only where
    it serves everything (HTTP included); `rust` takes it wherever it serves the command."""
    if requested == PY:
        return PY, None
    if requested == RS:
        reason = rust_unavailable_reason(bench)
        if reason == RUST_BENCH_ONLY:
            raise CliError(f"--runtime rust: {reason}: add --bench-requests N, or serve with --runtime python")
        if reason is not None:
            raise CliError(f"--runtime rust: {reason}. {RUST_NEXT_STEP}")
        return RS, None
    reason = rust_unavailable_reason()
    if reason is not None:
        return PY, f"serving with the Python runtime: {reason}"
    return RS, None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--version" in argv:
        print(f"vox-serve {__version__}")
        return 0
    if argv[:1] == ["say"]:  # a client of a running server, not a server
        from vox_serve.client.say import main as say

        return say(argv[1:])
    try:
        requested, bench = _requested_runtime(argv)
        if "-h" in argv or "--help" in argv:
            runtime = requested if requested in (PY, RS) else PY
            build_parser(runtime).parse_args(["--help"])
        runtime, reason = select_runtime(requested, bench)
        python_only = python_only_flags(given_flags(argv))
        if requested == "auto" and runtime == RS and python_only:
            runtime, reason = PY, f"serving with the Python runtime: {', '.join(python_only)} is served by it only"
        if reason:
            warn(reason)
        kept, warnings = check_flags(given_flags(argv), runtime, rust_missing=requested == "auto")
        for w in warnings:
            warn(w)
        config = build_config(kept, runtime)
    except CliError as exc:
        warn(f"error: {exc}")
        return 2
    if runtime == RS:
        return _serve_rust(config)
    if config.bench.num_requests > 0:
        from vox_serve.bench import run_bench
        from vox_serve.config import ConfigError
        from vox_serve.rt.checkpoint import CheckpointError

        try:
            return run_bench(config)
        except (CheckpointError, ConfigError) as exc:  # a model or setting the user named that cannot work
            warn(f"error: {exc}")
            return 2
    from vox_serve.api.server import serve

    return serve(config)


def _serve_rust(config: Any) -> int:
    """The Rust runtime serves the config (`_rt.serve`); errors it names are the user's (exit 2)."""
    from vox_serve import _rt
    from vox_serve.config import ConfigError
    from vox_serve.rt.checkpoint import CheckpointError

    try:
        return int(_rt.serve(json.dumps(config.to_dict())))
    except (CheckpointError, ConfigError, ValueError) as exc:
        warn(f"error: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())

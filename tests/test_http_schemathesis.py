"""Property-based testing of the HTTP API from its own OpenAPI document (schemathesis), per tiny model:
positive and negative data, every check (status codes, content types, response schemas and headers,
negative data refused, positive data accepted, auth enforced, unsupported methods), no 5xx.

In the suite the run is bounded: the fuzzing phase only, VOX_SCHEMATHESIS_EXAMPLES examples per
operation (default 30), about a minute of CPU for orpheus-tiny and qwen3-tts-tiny, one or two more for
csm-tiny (its bodies carry context codes and clips). The longer run reported in issue 10 adds
schemathesis' coverage phase (boundary values of every field, positive and negative) and the Base model:

    VOX_SCHEMATHESIS_EXAMPLES=100 VOX_SCHEMATHESIS_PHASES=examples,coverage,fuzzing VOX_SCHEMATHESIS_BASE=1 \
        python -m pytest -q -s tests/test_http_schemathesis.py

Each server runs with a short --max-model-len, so that any generated request finishes in a moment
(max_tokens and ignore_eos are fuzzed too), and the orpheus-tiny one with --api-key, so that the
`ignored_auth` check has something to check.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from http_harness import REPO, running_server

pytest.importorskip("schemathesis")
EXAMPLES = int(os.environ.get("VOX_SCHEMATHESIS_EXAMPLES", "30"))
PHASES = os.environ.get("VOX_SCHEMATHESIS_PHASES", "examples,fuzzing")
HOOKS_DIR = Path(__file__).parent / "schemathesis_run"
API_KEY = "schemathesis-key"
MODELS = {
    "orpheus-tiny": ("--max-model-len", "64", "--api-key", API_KEY),
    # Sessions schemathesis opens and never ends idle out; --max-sessions (tested elsewhere) must not
    # turn a long run into 503s, which the `not_a_server_error` check counts as failures.
    "qwen3-tts-tiny": ("--model", "qwen3-tts-tiny", "--max-model-len", "48", "--session-idle-timeout-s", "2",
                       "--max-sessions", "100000"),
    # CSM's own fields: an integer `speaker` and `context` turns (text, speaker, a base64 clip or codes)
    "csm-tiny": ("--model", "csm-tiny", "--max-model-len", "64"),
}
if os.environ.get("VOX_SCHEMATHESIS_BASE"):  # the voice-clone model too (slower: its encoders run per request)
    MODELS["qwen3-tts-base-tiny"] = ("--model", "qwen3-tts-base-tiny", "--max-model-len", "48",
                                     "--session-idle-timeout-s", "2", "--max-sessions", "100000")


def schemathesis_cli() -> list[str]:
    found = shutil.which("schemathesis", path=os.path.dirname(sys.executable)) or shutil.which("schemathesis")
    return [found] if found else [sys.executable, "-m", "schemathesis.cli"]


@pytest.mark.slow
@pytest.mark.parametrize("model", list(MODELS))
def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path: Path, model: str) -> None:
    flags = MODELS[model]
    with running_server(tmp_path, *flags) as server:
        auth = ["-H", f"Authorization: Bearer {API_KEY}"] if API_KEY in flags else []
        cmd = [*schemathesis_cli(), "run", f"{server.url}/openapi.json", "--checks", "all",
               "--exclude-checks", "positive_data_acceptance",  # replaced by the hook's positive_data_accepted
               "--mode", "all", "--phases", PHASES, "-n", str(EXAMPLES), "--seed", "10",
               "--request-timeout", "60", "--no-color", *auth]
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "hooks", "PYTHONPATH": f"{HOOKS_DIR}{os.pathsep}{REPO}"}
        run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        (tmp_path / "schemathesis.txt").write_text(run.stdout + run.stderr)
        summary = run.stdout[-6000:]
        assert run.returncode == 0, f"{server.log_tail(20)}\n{run.stderr[-2000:]}\n{summary}"
        generated = re.search(r"(\d+) generated", run.stdout)
        assert generated and int(generated.group(1)) >= EXAMPLES, summary
        assert "Traceback" not in server.log_path.read_text(errors="replace"), server.log_tail()
        print(f"{model}: {generated.group(0)} test cases, no failure")

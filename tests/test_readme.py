"""The README's quick start, followed literally (issue 10): CI runs its install and test commands
verbatim, its main job finishes with every request written, and its server recipe starts a server on a
free port, notices a server that died, and its curl examples return audio."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from http_harness import REPO, child_env

README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```bash\n(.*?)```", README, re.S)


def block_with(fragment: str) -> str:
    [block] = [b for b in BLOCKS if fragment in b]
    return block


def vox_serve_on_path(tmp: Path) -> dict[str, str]:
    """An environment whose `vox-serve` is this checkout's (exec keeps the process id the recipe waits on)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "vox-serve").write_text(f'#!/bin/sh\nexec {sys.executable} -m vox_serve.launch "$@"\n')
    (bin_dir / "vox-serve").chmod(0o755)
    return {**child_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_ci_runs_the_readme_install_and_test_commands_verbatim() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    for command in (block_with("install.sh").strip(), block_with("pytest").strip()):
        assert command in ci.splitlines(), command


def test_the_main_job_runs_as_written(tmp_path: Path) -> None:
    command = block_with("--bench-requests").strip()
    done = subprocess.run(command, shell=True, cwd=tmp_path, env=vox_serve_on_path(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"bench-{i:03d}.wav" for i in range(4)]
    assert "4/4 requests" in done.stderr and "RTF" in done.stdout


def recipe(*blocks: str) -> str:
    return "set -u\n" + "\n".join(blocks) + '\nkill "$SERVER" 2> /dev/null; wait\n'


@pytest.mark.slow
def test_the_server_recipe_and_its_curl_examples_work(tmp_path: Path) -> None:
    start = block_with("SERVER=$!")
    examples = [b for b in BLOCKS if "localhost:$PORT/generate" in b and "stream/start" not in b
                and "qwen3-tts-base" not in b]
    assert len(examples) == 2
    script = recipe(start, *examples, 'python -c "import wave; wave.open(\'hello.wav\').getnframes()"',
                    'echo "recipe ok"')
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=vox_serve_on_path(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "recipe ok" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]


def test_the_server_recipe_notices_a_server_that_exits(tmp_path: Path) -> None:
    start = block_with("SERVER=$!").replace("--device cpu", "--device gpu")  # refused: the server exits at once
    done = subprocess.run(["bash", "-c", recipe(start)], cwd=tmp_path, env=vox_serve_on_path(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert "vox-serve exited" in done.stdout, done.stdout + done.stderr

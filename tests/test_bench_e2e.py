"""Bench mode end to end: the README's main command writes valid, non-silent WAVs, repeatably."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

MAX_TOKENS = 70  # 10 frames: 7 chunks of 2048 samples each


def run_bench(out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "vox_serve.launch", "--model", "orpheus-tiny", "--device", "cpu",
           "--bench-requests", "4", "--bench-out", str(out), "--greedy",
           "--bench-kwargs", f'{{"max_tokens": {MAX_TOKENS}, "ignore_eos": true}}', *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def read_wav(path: Path) -> tuple[int, np.ndarray]:
    with wave.open(str(path)) as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        return w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def test_bench_writes_valid_repeatable_wavs(tmp_path: Path) -> None:
    first = run_bench(tmp_path / "a")
    run_bench(tmp_path / "b")
    files = sorted((tmp_path / "a").glob("*.wav"))
    assert [f.name for f in files] == [f"bench-{i:03d}.wav" for i in range(4)]
    frames = MAX_TOKENS // 7
    for f in files:
        rate, pcm = read_wav(f)
        assert rate == 24000
        assert len(pcm) == (frames - 3) * 2048  # frame 0 and the last two have no full SNAC window
        assert np.abs(pcm.astype(np.int32)).max() > 100  # not silent
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes()
    # Per-request figures and the overall real-time factor are printed.
    lines = first.stdout.splitlines()
    assert lines[0].split()[:4] == ["request", "ttfa_ms", "latency_s", "audio_s"]
    assert sum(line.startswith("bench-") and line.rstrip().endswith("length") for line in lines) == 4
    assert "RTF" in lines[-1]
    # Start-up stages and the run's progress are shown on stderr while they happen (issue 10).
    for stage in ("vox-serve: load:", "load done in", "vox-serve: warm-up:", "warm-up done in"):
        assert stage in first.stderr, first.stderr
    assert f"4/4 requests, {4 * MAX_TOKENS}/{4 * MAX_TOKENS} tokens" in first.stderr


def test_bench_rejects_unknown_request_field(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "vox_serve.launch", "--model", "orpheus-tiny", "--device", "cpu",
           "--bench-requests", "1", "--bench-kwargs", '{"language": "english"}']
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "language" in proc.stderr and "not accepted" in proc.stderr


def test_bench_serves_csm_tiny(tmp_path: Path) -> None:
    """CSM in bench mode (the README's command with a short max_tokens): 24 kHz WAVs of whole Mimi frames."""
    frames = 6
    cmd = [sys.executable, "-m", "vox_serve.launch", "--model", "csm-tiny", "--device", "cpu", "--bench-requests",
           "2", "--greedy", "--bench-out", str(tmp_path), "--bench-kwargs",
           f'{{"max_tokens": {frames}, "ignore_eos": true, "speaker": 1}}']
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name in ("bench-000.wav", "bench-001.wav"):
        rate, pcm = read_wav(tmp_path / name)
        assert rate == 24000 and len(pcm) == frames * 1920
        assert np.abs(pcm.astype(np.int32)).max() > 100
    assert sum(line.startswith("bench-") and line.rstrip().endswith("length") for line in proc.stdout.splitlines()) == 2

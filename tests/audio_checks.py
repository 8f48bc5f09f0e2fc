"""Independent checks of encoded audio: FFmpeg's ffprobe and ffmpeg (Debian's), not the PyAV we encode with."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np

RAW_INPUTS = {"pcm": ("s16le", None), "mulaw": ("mulaw", None)}  # headerless: the decoder must be told


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: install Debian's ffmpeg (see the README's install command)"
    return path


def raw_args(fmt: str, rate: int) -> list[str]:
    if fmt not in RAW_INPUTS:
        return []
    return ["-f", RAW_INPUTS[fmt][0], "-ar", str(rate), "-ac", "1"]


def probe(data: bytes, tmp: Path, fmt: str, rate: int = 24000) -> dict:
    """ffprobe's view of one file: {"format": {...}, "streams": [...]}."""
    path = tmp / f"probe.{fmt}"
    path.write_bytes(data)
    done = subprocess.run([_tool("ffprobe"), "-v", "error", *raw_args(fmt, rate), "-show_format", "-show_streams",
                           "-of", "json", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def decode(data: bytes, tmp: Path, fmt: str, rate: int = 24000, out_rate: int | None = None) -> np.ndarray:
    """ffmpeg's decoding of `data` as float32 mono samples (at `out_rate`, default the file's own)."""
    path = tmp / f"decode.{fmt}"
    path.write_bytes(data)
    resample = ["-ar", str(out_rate)] if out_rate else []
    done = subprocess.run([_tool("ffmpeg"), "-v", "error", *raw_args(fmt, rate), "-i", str(path), "-f", "f32le",
                           "-ac", "1", *resample, "-"], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return np.frombuffer(done.stdout, dtype="<f4")


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    """The strongest frequency of the middle of a signal (edges trimmed: codec and filter transients)."""
    middle = samples[len(samples) // 4: 3 * len(samples) // 4]
    spectrum = np.abs(np.fft.rfft(middle * np.hanning(len(middle))))
    return float(np.argmax(spectrum) * rate / len(middle))


def tone(seconds: float, hz: float = 440.0, rate: int = 24000, amplitude: int = 10000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * hz * t) * amplitude).astype("<i2").tobytes()

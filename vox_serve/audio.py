"""WAV (RIFF, PCM16 mono) encoding for complete files and for streams of unknown length."""

from __future__ import annotations

import struct
from pathlib import Path

STREAMING_SIZE = 0xFFFFFFFF  # RIFF/data size sentinel of a stream whose length is not known yet


def wav_header(sample_rate: int, num_samples: int | None, channels: int = 1, bits: int = 16) -> bytes:
    """A 44-byte WAV header; `num_samples=None` writes the streaming size sentinel."""
    if sample_rate <= 0:
        raise ValueError("sample_rate must be positive")
    block = channels * bits // 8
    if num_samples is None:
        data_size = riff_size = STREAMING_SIZE
    else:
        data_size = num_samples * block
        riff_size = 36 + data_size
    return (
        b"RIFF" + struct.pack("<I", riff_size) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
        + b"data" + struct.pack("<I", data_size)
    )


def wav_bytes(pcm16: bytes, sample_rate: int) -> bytes:
    """A complete WAV file around little-endian int16 mono samples."""
    if len(pcm16) % 2:
        raise ValueError("PCM16 data must have an even number of bytes")
    return wav_header(sample_rate, len(pcm16) // 2) + pcm16


def write_wav(path: str | Path, pcm16: bytes, sample_rate: int) -> None:
    Path(path).write_bytes(wav_bytes(pcm16, sample_rate))

"""Uploaded audio files, read within bounds (libsndfile through soundfile; numpy, no torch).

A compressed file can hold far more audio than its size suggests (an hour of FLAC silence is half a
megabyte), and its header may claim any length. So nothing here trusts the header beyond a first
refusal: samples are read block by block, and reading stops once the file has proved longer than the
caller allows. Memory stays bounded by the limit, never by what the file holds.
"""

from __future__ import annotations

import io

import numpy as np

BLOCK_FRAMES = 1 << 16  # frames read at a time
MAX_SAMPLE_RATE = 384_000  # the highest rate of common audio hardware; beyond it a header is nonsense
MAX_CHANNELS = 64


class AudioError(ValueError):
    """Bytes that are not audio within the limits; the message says why (for the `audio` field)."""


def _open(data: bytes):  # noqa: ANN202 - soundfile.SoundFile, imported lazily
    import soundfile  # only uploads need libsndfile: a server without it still serves text

    try:
        sound = soundfile.SoundFile(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        why = getattr(exc, "error_string", None) or str(exc)
        raise AudioError(f"is not decodable audio ({why.strip().rstrip('.')})") from exc
    if not 0 < sound.samplerate <= MAX_SAMPLE_RATE or not 0 < sound.channels <= MAX_CHANNELS:
        sound.close()
        raise AudioError(f"has {sound.channels} channels at {sound.samplerate} Hz; at most {MAX_CHANNELS} "
                         f"channels up to {MAX_SAMPLE_RATE} Hz are read")
    return sound


def _read(data: bytes, max_seconds: float, keep: bool) -> tuple[list[np.ndarray], int, int]:
    """(mono float32 blocks if `keep`, sample rate, frames) of an audio file; AudioError once it passes
    max_seconds (its header is believed only when it says the file is too long)."""
    import soundfile

    with _open(data) as sound:
        rate, limit = sound.samplerate, int(max_seconds * sound.samplerate)
        claimed = sound.frames if 0 < sound.frames < 2**62 else 0  # some containers do not say
        if claimed > limit:
            raise AudioError(f"is {claimed / rate:.1f} s long; the most this model takes is {max_seconds:g} s")
        blocks, frames = [], 0
        while True:
            try:
                block = sound.read(min(BLOCK_FRAMES, limit + 1 - frames), dtype="float32", always_2d=True)
            except (soundfile.LibsndfileError, RuntimeError, ValueError) as exc:
                raise AudioError(f"is not decodable audio ({str(exc).strip().rstrip('.')})") from exc
            if len(block) == 0:
                return blocks, rate, frames
            frames += len(block)
            if frames > limit:
                raise AudioError(f"is longer than {max_seconds:g} s, the most this model takes")
            if keep:
                blocks.append(block.mean(axis=1))


def audio_seconds(data: bytes, max_seconds: float) -> float:
    """The length of an audio file in seconds, decoding it block by block (nothing kept); AudioError
    for bytes that are not audio, or audio longer than max_seconds."""
    _, rate, frames = _read(data, max_seconds, keep=False)
    return frames / rate


def read_mono(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    """An audio file -> (float32 mono samples in [-1, 1], sample rate), channels averaged; AudioError
    for bytes that are not audio, or audio longer than max_seconds (found without decoding the rest)."""
    blocks, rate, _ = _read(data, max_seconds, keep=True)
    samples = np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
    return samples.astype(np.float32, copy=False), rate

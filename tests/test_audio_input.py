"""Uploaded reference audio: decoding to mono float samples, and band-limited resampling."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import soundfile
import torch

from vox_serve.audio_input import decode_audio, resample


def tones(rate: int, seconds: float, freqs: tuple[float, ...]) -> torch.Tensor:
    t = torch.arange(int(rate * seconds), dtype=torch.float64) / rate
    return sum(0.3 * torch.sin(2 * math.pi * f * t) for f in freqs)


@pytest.mark.parametrize("orig", [16000, 22050, 44100, 48000, 24000])
def test_resampled_tones_equal_the_tones_sampled_at_the_new_rate(orig: int) -> None:
    freqs = (440.0, 3000.0, 6500.0)  # all below both Nyquist frequencies
    out = resample(tones(orig, 1.0, freqs).float(), orig, 24000)
    assert out.shape == (24000,) and out.dtype == torch.float32
    want = tones(24000, 1.0, freqs).float()
    edge = 300  # the signal starts and stops abruptly: the filter rings there
    assert (out[edge:-edge] - want[edge:-edge]).abs().max().item() < 2e-3


def test_downsampling_removes_what_the_new_rate_cannot_hold() -> None:
    """A 15 kHz tone cannot exist at 24 kHz (Nyquist 12 kHz): it must vanish, not alias to 9 kHz."""
    out = resample(tones(48000, 1.0, (15000.0,)).float(), 48000, 24000)
    assert out[300:-300].abs().max().item() < 0.003


def test_output_length_rounds_up() -> None:
    assert resample(torch.zeros(441), 44100, 24000).shape == (240,)
    assert resample(torch.zeros(1001), 16000, 24000).shape == (math.ceil(1001 * 1.5),)


def wav(samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, subtype=subtype, format="WAV")
    return buf.getvalue()


def test_decode_averages_channels_and_keeps_the_rate() -> None:
    left = np.full(800, 0.5, dtype=np.float32)
    stereo = np.stack([left, -0.25 * np.ones_like(left)], axis=1)
    samples, rate = decode_audio(wav(stereo, 16000, "FLOAT"), 60.0)
    assert rate == 16000 and samples.dtype == np.float32 and samples.shape == (800,)
    np.testing.assert_allclose(samples, 0.125)


def test_decode_rejects_bytes_that_are_not_audio() -> None:
    with pytest.raises(ValueError, match="is not decodable audio"):
        decode_audio(b"RIFF but not really a wave file" * 8, 60.0)


def test_decoding_stops_at_the_limit_instead_of_reading_a_long_file_whole() -> None:
    """Issue 10, defect 1: an hour of FLAC silence (half a megabyte) was decoded whole before its
    length was checked."""
    from vox_serve.audio_upload import AudioError, audio_seconds

    buf = io.BytesIO()
    soundfile.write(buf, np.zeros((48000 * 3600, 1), np.int16), 48000, format="FLAC", subtype="PCM_16")
    with pytest.raises(AudioError, match="3600.0 s long"):
        decode_audio(buf.getvalue(), 60.0)
    raw = io.BytesIO()  # a container that states no length: the blocks are counted, up to the limit
    soundfile.write(raw, np.zeros(16000 * 3, np.int16), 16000, format="RAW", subtype="PCM_16")
    with pytest.raises(AudioError, match="is not decodable audio"):
        audio_seconds(raw.getvalue(), 1.0)  # headerless: libsndfile cannot read it
    clip = wav(np.zeros(16000 * 3, np.float32), 16000)
    assert audio_seconds(clip, 60.0) == 3.0
    with pytest.raises(AudioError, match="longer than 2 s|3.0 s long"):
        decode_audio(clip, 2.0)

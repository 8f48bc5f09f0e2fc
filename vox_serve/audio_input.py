"""Uploaded reference audio: decoding to float samples and resampling to a model's rate."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from vox_serve.audio_upload import read_mono

# Filter half-length in zero crossings of the low-pass sinc, and its cut-off as a fraction of the lower
# Nyquist frequency: tones up to 0.85 x Nyquist pass within 1e-3, aliases fall below -55 dB.
SINC_ZERO_CROSSINGS = 24
ROLLOFF = 0.97
# torchaudio's default resampler (sinc_interp_hann, width 6, rolloff 0.99), which some references use.
TORCHAUDIO_ZERO_CROSSINGS, TORCHAUDIO_ROLLOFF = 6, 0.99


def decode_audio(data: bytes, max_seconds: float) -> tuple[np.ndarray, int]:
    """An audio file's bytes -> (float32 mono samples in [-1, 1], sample rate); channels are averaged.

    Decodes at most `max_seconds` (and a block): longer audio raises AudioError (a ValueError) without
    being decoded whole, as do bytes that are not audio libsndfile can read (with its reason).
    """
    return read_mono(data, max_seconds)


def resample(audio: torch.Tensor, orig_rate: int, new_rate: int, *, zero_crossings: int = SINC_ZERO_CROSSINGS,
             rolloff: float = ROLLOFF) -> torch.Tensor:
    """audio [samples] float -> [ceil(samples * new_rate / orig_rate)] by band-limited interpolation.

    Each output sample is a Hann-windowed sinc of the input around its position, the sinc's cut-off just
    below the lower of the two Nyquist frequencies, so downsampling does not alias. With both rates
    divided by their gcd, every block of `p_in` input samples yields `p_out` output samples, and output j
    of every block uses the same filter: the whole signal is one convolution of stride `p_in` with `p_out`
    filters. Computed in float64. With TORCHAUDIO_ZERO_CROSSINGS and TORCHAUDIO_ROLLOFF this is
    torchaudio's default `resample`.
    """
    if orig_rate == new_rate:
        return audio
    g = math.gcd(orig_rate, new_rate)
    p_in, p_out = orig_rate // g, new_rate // g
    cutoff = min(p_in, p_out) * rolloff  # in cycles per block of p_in input samples
    half = math.ceil(zero_crossings * p_in / cutoff)  # filter half-width in input samples
    offsets = torch.arange(-half, half + p_in, dtype=torch.float64) / p_in  # input times within a block
    phases = -torch.arange(p_out, dtype=torch.float64)[:, None] / p_out  # output times, in blocks
    t = ((offsets[None, :] + phases) * cutoff).clamp(-zero_crossings, zero_crossings)
    window = torch.cos(t * math.pi / (2 * zero_crossings)) ** 2
    filters = torch.special.sinc(t) * window * (cutoff / p_in)  # [p_out, taps], unit DC gain
    x = F.pad(audio.double()[None, None], (half, half + p_in))
    out = F.conv1d(x, filters[:, None], stride=p_in)  # [1, p_out, blocks]
    length = math.ceil(audio.shape[-1] * p_out / p_in)
    return out[0].t().reshape(-1)[:length].to(audio.dtype)


def resample_as_torchaudio(audio: torch.Tensor, orig_rate: int, new_rate: int) -> torch.Tensor:
    """`resample` with torchaudio's default filter: what references that resample through torchaudio get
    (within float32 rounding of their kernel)."""
    return resample(audio, orig_rate, new_rate, zero_crossings=TORCHAUDIO_ZERO_CROSSINGS, rolloff=TORCHAUDIO_ROLLOFF)

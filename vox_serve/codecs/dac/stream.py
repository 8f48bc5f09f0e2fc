"""Streaming DAC decode in fixed-size windows (DAC is not causal, so there is no state to carry).

Chunk c keeps frames [start, end) and decodes the window [start - lookback, start - lookback + size),
size = lookback + frames_per_chunk + lookahead. The window's frames that do not exist (before frame 0,
or after the last frame once generation has ended) are marked invalid and decode as the one-shot
decode's zero padding. With lookback and lookahead >= `receptive_field(cfg)` (10 and 10 frames for
DAC 44.1 kHz, 116 ms each) the joined chunks equal the one-shot decode of all frames to float rounding;
a shorter lookahead trades that for latency (the error is measured in tests/test_dac_codec.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vox_serve.codecs.dac.decoder import DacDecoder


@dataclass(frozen=True)
class DacWindow:
    """Where chunk c of a request reads and what it keeps, in frames of the request."""

    first: int  # first frame of the window (negative near the start)
    start: int  # first kept frame
    end: int  # one past the last kept frame
    valid_end: int  # one past the last frame that exists (the window may reach past it)

    def valid(self, size: int) -> tuple[int, int]:
        """(first, end) valid frames in window coordinates."""
        return max(0, -self.first), min(size, self.valid_end - self.first)


def chunk_window(index: int, num_frames: int, final: bool, *, frames_per_chunk: int, lookback: int,
                 lookahead: int) -> DacWindow | None:
    """Chunk `index` once it can be decoded with num_frames frames so far (final: no more will come)."""
    start = index * frames_per_chunk
    end = start + frames_per_chunk
    if final:
        end = min(end, num_frames)
        if end <= start:
            return None
    elif num_frames < end + lookahead:
        return None
    return DacWindow(first=start - lookback, start=start, end=end, valid_end=min(num_frames, end + lookahead))


def decode_windows(decoder: DacDecoder, codes: Tensor, valid: Tensor, lookback: int, frames: int) -> Tensor:
    """codes [B, 9, size] (any codes at invalid frames), valid [B, 2] -> the kept samples [B, frames * hop]:
    frames lookback .. lookback + frames of each window (a short final chunk uses the first part)."""
    hop = decoder.cfg.hop_length
    audio = decoder.decode(codes, valid)
    return audio[:, lookback * hop : (lookback + frames) * hop]


def gather_window(codes: Tensor, window: DacWindow, size: int) -> Tensor:
    """codes [1, 9, T] -> [1, 9, size]: the window's frames, frames that do not exist as code 0."""
    out = torch.zeros((*codes.shape[:2], size), dtype=codes.dtype, device=codes.device)
    lo, hi = window.valid(size)
    out[..., lo:hi] = codes[..., window.first + lo : window.first + hi]
    return out

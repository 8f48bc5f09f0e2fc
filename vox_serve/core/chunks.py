"""Which frames make audio chunk c, and when it can be decoded (pure Python).

Chunk c emits frames [skip + c * N, skip + (c + 1) * N), except that a smaller first chunk of F
frames (`--first-chunk-frames`, for a sooner first audio) shifts the later ones: chunk 0 emits
[skip, skip + F) and chunk c >= 1 [skip + F + (c - 1) * N, skip + F + c * N). Decoding needs a window that reaches
`lookback` frames before and `lookahead` frames after, so it is ready once
`skip + (c + 1) * N + lookahead` frames exist. When generation has ended, a shorter final chunk
emits what is left up to the last frame that still has its lookahead (as the published
streaming decoders do; frames without lookahead are never emitted) -- or, for a codec that pads at the
sequence end (`meta.codec_pads_end`, DAC), up to the last frame, its window ending there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vox_serve.core.meta import ProgramMeta


@dataclass(frozen=True)
class ChunkWindow:
    chunk_index: int
    first_frame: int  # first frame of the window (lookback included)
    start: int  # first emitted frame
    end: int  # one past the last emitted frame
    window_end: int  # one past the last frame the window reads

    @property
    def num_frames(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ChunkGeometry:
    frames_per_chunk: int
    lookback: int
    lookahead: int
    skip: int
    codes_per_frame: int
    first_frames: int = 0  # frames of chunk 0 (0: frames_per_chunk)
    pads_end: bool = False  # the final chunk emits every frame (meta.codec_pads_end)

    @classmethod
    def from_meta(cls, meta: ProgramMeta, frames_per_chunk: int, first_frames: int = 0) -> ChunkGeometry:
        return cls(frames_per_chunk, meta.codec_lookback_frames, meta.codec_lookahead_frames,
                   meta.skip_leading_frames, meta.codes_per_frame, first_frames, meta.codec_pads_end)

    @property
    def final_lookahead(self) -> int:
        """Frames after a final chunk's last emitted frame that must exist."""
        return 0 if self.pads_end else self.lookahead

    @property
    def window(self) -> int:
        return self.lookback + self.frames_per_chunk + self.lookahead

    def emitted(self, index: Any) -> tuple[Any, Any]:
        """[start, end) of the frames a full chunk `index` emits (ints for an int, arrays for an array)."""
        n = self.frames_per_chunk
        first = self.first_frames or n
        index = np.asarray(index, dtype=np.int64)
        # chunk c >= 1 starts at skip + first + (c - 1) * n, chunk 0 at skip; every chunk ends at skip + first + c * n
        past = index * n
        start = self.skip + np.minimum(index, 1) * (past + (first - n))
        end = past + (self.skip + first)
        return (int(start), int(end)) if index.ndim == 0 else (start, end)

    def chunk(self, index: int, num_frames: int, final: bool) -> ChunkWindow | None:
        """Chunk `index` if it can be decoded with `num_frames` frames generated, else None."""
        start, end = self.emitted(index)
        if num_frames < end + self.lookahead:
            if not final:
                return None
            end = min(end, num_frames - self.final_lookahead)
            if end <= start:
                return None
        return ChunkWindow(index, start - self.lookback, start, end, min(end + self.lookahead, num_frames))

    def frames_of(self, codes: list[int], window: ChunkWindow) -> list[list[int]]:
        """The window's frames from a flat code list ([frames][codes_per_frame]): the host-side statement of
        the window rules that codec stages apply on the device (`vox_serve.rt.codec_window`), kept as the
        reference they are tested against."""
        k = self.codes_per_frame
        first = max(window.first_frame, 0)
        frames = [codes[f * k : (f + 1) * k] for f in range(first, window.window_end)]
        # A window that starts before frame 0 (no skip) repeats the first frame as its lookback.
        return [frames[0]] * (first - window.first_frame) + frames

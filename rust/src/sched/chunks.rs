//! Which frames make audio chunk c and when it can be decoded (vox_serve/core/chunks.py).
//!
//! Chunk c emits frames [skip + c * N, skip + (c + 1) * N), except that a smaller first chunk of F
//! frames shifts the later ones; decoding needs `lookback` frames before and `lookahead` after.

use super::config::{EngineLimits, ProgramMeta};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkGeometry {
    pub frames_per_chunk: i64,
    pub lookback: i64,
    pub lookahead: i64,
    pub skip: i64,
    pub codes_per_frame: i64,
    /// Frames of chunk 0 (0: frames_per_chunk).
    pub first_frames: i64,
}

impl ChunkGeometry {
    pub fn new(meta: &ProgramMeta, limits: &EngineLimits) -> ChunkGeometry {
        ChunkGeometry {
            frames_per_chunk: limits.frames_per_chunk,
            lookback: meta.codec_lookback_frames,
            lookahead: meta.codec_lookahead_frames,
            skip: meta.skip_leading_frames,
            codes_per_frame: meta.codes_per_frame,
            first_frames: limits.first_chunk_frames,
        }
    }

    fn first(&self) -> i64 {
        if self.first_frames > 0 { self.first_frames } else { self.frames_per_chunk }
    }

    /// [start, end) of the frames full chunk `index` emits.
    pub fn emitted(&self, index: i64) -> (i64, i64) {
        let first = self.first();
        if index > 0 {
            let start = self.skip + first + (index - 1) * self.frames_per_chunk;
            (start, start + self.frames_per_chunk)
        } else {
            (self.skip, self.skip + first)
        }
    }

    /// Frames that must exist before chunk 0 can be decoded.
    pub fn first_need(&self) -> i64 {
        self.skip + self.first() + self.lookahead
    }

    /// One past the last frame the (full) window of chunk `index` reads.
    pub fn window_end(&self, index: i64) -> i64 {
        self.emitted(index).1 + self.lookahead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_smaller_first_chunk_shifts_the_later_ones() {
        let g = ChunkGeometry { frames_per_chunk: 4, lookback: 1, lookahead: 2, skip: 1, codes_per_frame: 7,
                                first_frames: 2 };
        assert_eq!(g.emitted(0), (1, 3));
        assert_eq!(g.emitted(1), (3, 7));
        assert_eq!(g.emitted(2), (7, 11));
        assert_eq!(g.window_end(1), 9);
    }
}

"""benchmark/clone_gap.py runs on the tiny Base model (its figures are for the GPU; here only that it
measures what it says: streams running from a saved voice, clips admitted while they run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
import clone_gap  # noqa: E402


def test_longest_gap_counts_only_intervals_that_overlap_the_window() -> None:
    times = [0.0, 1.0, 1.5, 4.0, 4.2]
    assert clone_gap.longest_gap(times, 0.0, 1.2) == 1.0
    assert clone_gap.longest_gap(times, 2.0, 3.0) == 2.5  # the interval 1.5 -> 4.0 spans the window
    assert clone_gap.longest_gap(times, 4.1, 9.0) == pytest.approx(0.2)
    assert clone_gap.longest_gap([1.0], 0.0, 2.0) == 0.0


@pytest.mark.parametrize("inline", [False, True])
def test_the_benchmark_runs_streams_and_clips_to_the_end(inline: bool) -> None:
    args = argparse.Namespace(model="qwen3-tts-base-tiny", device="cpu", load_format="auto", streams=2, clips=1,
                              clip_seconds=2.0, max_tokens=30, warm_chunks=2, inline=inline)
    row = clone_gap.run(args)
    assert row["inline"] is inline and row["streams"] == 2 and row["chunk_audio_ms"] > 0
    assert row["encoding_window_ms"] > 0 and row["longest_gap_before_ms"] > 0
    # the streams were mid-stream when the clips came (2 of their 3 chunks sent): a chunk interval spans
    # the encoding window, so the gap measured there is a real one
    assert row["longest_gap_while_encoding_ms"] > 0

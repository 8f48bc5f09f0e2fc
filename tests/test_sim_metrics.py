"""The client-side metrics shared by the simulator and the HTTP load benchmark (vox_serve/metrics.py)."""

from __future__ import annotations

import math

import pytest

from vox_serve.metrics import (
    RequestTrace,
    all_chunks_viable,
    chunks_on_time,
    percentile,
    summarize,
    ttfa,
    viability,
)

SR = 1000


def test_a_chunk_is_on_time_when_the_audio_before_it_outlasts_the_time_since_the_first_chunk() -> None:
    chunks = [(1.0, 100), (1.05, 100), (1.25, 100), (1.29, 100)]
    # chunk 1: 0.1 s received > 0.05 s elapsed; chunk 2: 0.2 s is not > 0.25 s; chunk 3: 0.3 > 0.29
    assert chunks_on_time(chunks, SR) == [True, False, True]
    assert viability(chunks, SR) == pytest.approx(200 / 3)
    assert all_chunks_viable(chunks, SR) == 0.0
    assert chunks_on_time([(0.0, 100), (0.1, 100)], SR) == [False]  # arriving as the audio runs out is late


def test_zero_or_one_chunk_is_viable() -> None:
    assert viability([], SR) == 100.0 and viability([(3.0, 10)], SR) == 100.0
    assert all_chunks_viable([(3.0, 10)], SR) == 100.0


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([5], 95) == 5
    assert math.isnan(percentile([], 90))


def test_summary_counts_ttfa_and_viability_over_streams_and_throughput_over_everything() -> None:
    stream = RequestTrace("s", sent=0.0, chunks=[(0.2, 1000), (0.5, 1000), (2.5, 1000)], finished=2.5)
    batch = RequestTrace("b", sent=1.0, streaming=False, chunks=[(2.0, 500), (3.0, 500)], finished=3.0)
    failed = RequestTrace("f", sent=0.5, error="boom", finished=0.6)
    s = summarize([stream, batch, failed], SR)
    assert ttfa(stream) == pytest.approx(0.2)
    assert s.ttfa_p90 == pytest.approx(0.2)  # the non-streaming request is not a stream
    assert s.viability == pytest.approx(50.0) and s.all_chunks == 0.0 and s.underruns == 1
    assert s.num_completed == 2 and s.num_failed == 1
    assert s.audio_seconds == pytest.approx(4.0) and s.duration == pytest.approx(3.0)
    assert s.throughput == pytest.approx(4.0 / 3.0)
    assert s.latency_p90 == pytest.approx(2.0 + 0.9 * 0.5)

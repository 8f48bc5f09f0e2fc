"""`--first-chunk-frames`: a smaller first audio chunk (sooner first audio) that changes nothing else."""

from __future__ import annotations

import numpy as np
import pytest
from orpheus_helpers import run_requests

from tests.engine_helpers import build_program
from vox_serve.cli import CliError, build_config, check_flags, given_flags
from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.core.chunks import ChunkGeometry
from vox_serve.engine import build_engine

SAMPLES_PER_FRAME = 1920


def test_first_chunk_shifts_every_later_chunk() -> None:
    g = ChunkGeometry(frames_per_chunk=10, lookback=0, lookahead=0, skip=0, codes_per_frame=16, first_frames=3)
    assert g.chunk(0, 2, final=False) is None
    first = g.chunk(0, 3, final=False)
    assert (first.start, first.end, first.first_frame) == (0, 3, 0)
    assert g.chunk(1, 12, final=False) is None
    assert (g.chunk(1, 13, final=False).start, g.chunk(1, 13, final=False).end) == (3, 13)
    assert (g.chunk(2, 23, final=False).start, g.chunk(2, 23, final=False).end) == (13, 23)
    last = g.chunk(3, 25, final=True)
    assert (last.start, last.end) == (23, 25)
    plain = ChunkGeometry(10, 0, 0, 0, 16)  # no first-chunk size: every chunk is 10 frames
    assert (plain.chunk(1, 20, final=False).start, plain.chunk(1, 20, final=False).end) == (10, 20)


def test_first_chunk_geometry_with_lookback_and_lookahead() -> None:
    g = ChunkGeometry(frames_per_chunk=4, lookback=1, lookahead=2, skip=1, codes_per_frame=7, first_frames=2)
    first = g.chunk(0, 5, final=False)  # emits frames 1, 2; reads 0 .. 4
    assert (first.first_frame, first.start, first.end, first.window_end) == (0, 1, 3, 5)
    second = g.chunk(1, 9, final=False)
    assert (second.first_frame, second.start, second.end, second.window_end) == (2, 3, 7, 9)


def _run(first: int | None) -> list:
    sched = SchedulerConfig(max_batch_size=4, max_codec_batch=4, first_chunk_frames=first)
    config = VoxConfig(model=ModelConfig(model="qwen3-tts-tiny", device="cpu", seed=0),
                       cache=CacheConfig(max_num_pages=64), scheduler=sched)
    program = build_program(config)
    fields = [{"text": "Hello there.", "max_tokens": 23, "ignore_eos": True},
              {"text": "A second, longer request.", "max_tokens": 17, "ignore_eos": True}]
    return run_requests(program, config, fields)


def test_a_smaller_first_chunk_changes_only_the_chunking() -> None:
    plain, early = _run(None), _run(2)
    for a, b in zip(plain, early, strict=True):
        assert a.tokens == b.tokens
        sizes = [len(c) // 2 // SAMPLES_PER_FRAME for c in b.extra["chunks"]]
        assert sizes[0] == 2 and sum(sizes) == b.num_generated
        assert all(s == 10 for s in sizes[1:-1])
        pcm_a = np.frombuffer(b"".join(a.extra["chunks"]), dtype=np.int16).astype(np.int32)
        pcm_b = np.frombuffer(b"".join(b.extra["chunks"]), dtype=np.int16).astype(np.int32)
        assert pcm_a.shape == pcm_b.shape
        assert np.abs(pcm_a - pcm_b).max() <= 2  # the streaming codec: chunked == one-shot


def test_first_chunk_frames_is_validated() -> None:
    with pytest.raises(CliError, match="at most --detokenize-interval"):
        check_flags(given_flags(["--first-chunk-frames", "5", "--detokenize-interval", "4"]), "python", False)
    with pytest.raises(CliError, match=">= 1"):
        check_flags(given_flags(["--first-chunk-frames", "0"]), "python", False)
    kept, _ = check_flags(given_flags(["--model", "qwen3-tts-tiny", "--device", "cpu", "--first-chunk-frames", "11",
                                       "--max-num-pages", "16"]), "python", False)
    with pytest.raises(ValueError, match="exceeds the 10 frames"):
        build_program(build_config(kept, "python"))


def test_the_engine_spec_publishes_the_first_chunk_stage() -> None:
    kept, _ = check_flags(given_flags(["--model", "qwen3-tts-tiny", "--device", "cpu", "--first-chunk-frames", "2",
                                       "--max-num-pages", "16"]), "python", False)
    spec = build_engine(build_config(kept, "python"))
    stage = spec["stages"]["codec_first"]
    assert spec["codec_window"]["first_chunk_frames"] == 2 and stage["buckets"] == spec["stages"]["codec"]["buckets"]
    assert set(stage["callables"]) == {str(b) for b in stage["buckets"]}  # CPU: every bucket is a callable
    outputs = {f["name"]: f for f in spec["arenas"]["step_out"]["fields"]}
    assert outputs["codec_first_pcm"]["shape"][1] == 2 * SAMPLES_PER_FRAME
    assert "codec_first_window_end" in spec["sections"]["codec_first"]
    plain, _ = check_flags(given_flags(["--model", "qwen3-tts-tiny", "--device", "cpu", "--max-num-pages", "16"]),
                           "python", False)
    assert "codec_first" not in build_engine(build_config(plain, "python"))["stages"]

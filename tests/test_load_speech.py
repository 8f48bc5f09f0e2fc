"""benchmark/load.py through /v1/audio/speech: its Ogg Opus sample counter (granule positions, no decoding)
agrees with the audio put in, and a short run against a real server counts the audio of every request."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from audio_checks import tone
from http_harness import REPO, Server, child_env, running_server

from vox_serve.formats import EncodeOptions
from vox_serve.formats.encoders import make_encoder

SPEC = importlib.util.spec_from_file_location("load_bench", REPO / "benchmark" / "load.py")
load_bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(load_bench)


def test_opus_counter_counts_the_samples_encoded_as_pages_arrive() -> None:
    encoder = make_encoder(EncodeOptions.parse("opus"), 24000)
    counter, counts = load_bench.OggOpusCounter(24000), []
    pcm = tone(2.0)
    for i in range(0, len(pcm), 8192):
        piece = encoder.encode(pcm[i:i + 8192])
        for cut in range(0, len(piece), 100):  # pages split across network reads
            counts.append(counter.samples(piece[cut:cut + 100]))
    counts.append(counter.samples(encoder.finish()))
    assert abs(sum(counts) - 48000) <= 960  # within one Opus frame: the encoder's look-ahead is trimmed
    assert sum(1 for c in counts[:-1] if c) > 10  # counted while streaming, not at the end


def test_pcm_counter_skips_the_wav_header_and_holds_odd_bytes() -> None:
    counter = load_bench.PcmCounter(24000, header_bytes=44)
    assert counter.samples(b"\0" * 45) == 0 and counter.samples(b"\0" * 3) == 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("load-speech")) as srv:
        yield srv


@pytest.mark.parametrize("fmt", ["opus", "pcm"])
def test_load_run_through_the_speech_route(server: Server, fmt: str, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    cmd = [sys.executable, "benchmark/load.py", "--url", server.url, "--endpoint", "speech",
           "--response-format", fmt, "--offline", "2", "--max-tokens", "70", "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [run] = json.loads(out.read_text())["runs"]
    assert run["num_completed"] == 2 and run["num_failed"] == 0
    assert abs(run["audio_seconds"] - 2 * 7 * 2048 / 24000) < 0.1

"""--enable-disaggregation through the HTTP server (orpheus-tiny on CPU, --dp-size 2: each replica a pair of
engine halves): streamed and whole WAVs equal to the whole engine's bench-mode output on both replicas
(headers byte-identical, samples within PCM_LSB_ATOL: the codec batches differ)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from http_harness import (
    PCM_LSB_ATOL,
    bench_pcm,
    generate_concurrently,
    parse_wav,
    pcm_difference,
    running_server,
    wait_until,
)

FIELDS = {"voice": "leo", "max_tokens": 42, "seed": 5, "ignore_eos": True}
TEXT = "Split in two."


def test_disaggregated_server_streams_what_the_whole_engine_makes(tmp_path: Path) -> None:
    expected = bench_pcm(tmp_path / "bench", TEXT, FIELDS, "--greedy", "--max-batch-size", "16")
    with running_server(tmp_path, "--dp-size", "2", "--enable-disaggregation", "--greedy") as server:
        requests = [{"text": TEXT, **FIELDS, "streaming": i % 2 == 0} for i in range(6)]
        responses = generate_concurrently(server, requests)
        assert [r.status_code for r in responses] == [200] * 6
        want = parse_wav(expected).pcm
        for r in responses:
            assert any(parse_wav(r.content).pcm) and pcm_difference(parse_wav(r.content).pcm, want) <= PCM_LSB_ATOL
        whole = [r.content for r in responses if r.headers.get("content-length")]
        assert [w[:44] for w in whole] == [expected[:44]] * 3  # whole WAVs: the same header and length
        served = Counter(int(r.headers["x-replica"]) for r in responses)
        assert set(served) == {0, 1}, served  # least loaded: both replicas took requests
        wait_until(server.pools_full, 10.0)
        assert "(codec half)" in server.log_tail(400)

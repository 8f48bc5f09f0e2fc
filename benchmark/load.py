"""Load benchmark: an open-loop HTTP client against a running vox-serve server.

Requests arrive with Gamma-distributed gaps (shape 1 = Poisson) at each swept rate, or all at once
(`--offline N`). Every request streams `POST /generate` (or, with `--endpoint speech`, the
OpenAI-compatible `POST /v1/audio/speech` as PCM or Ogg Opus) and records when each piece of audio
arrived; the metrics (TTFA, per-chunk and all-chunks viability, underruns, real-time factor) come
from `vox_serve.metrics`, the same definitions every benchmark uses. One JSON file per run holds
the exact command, the git commit, the GPU and the settings.

    python benchmark/load.py --url http://127.0.0.1:8000 --rates 1,2,4,8,16 --num-requests 64 \
        --max-tokens 1024 --out benchmark/results/load.json
    python benchmark/load.py --url http://127.0.0.1:8000 --offline 256 --max-tokens 1024
    python benchmark/load.py --endpoint speech --response-format opus --rates 8,12,16 --num-requests 120
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vox_serve.bench_report import environment  # noqa: E402
from vox_serve.metrics import RequestTrace, arrival_times, summarize, ttfa  # noqa: E402

WAV_HEADER = 44
TEXT = ("Hey there, thanks for calling. I can help you with your booking today, "
        "so let me pull up the details and walk you through the options we have.")


class PcmCounter:
    """Samples in the pieces of a PCM16 body, after a header of `header_bytes` (44 for WAV)."""

    def __init__(self, sample_rate: int, header_bytes: int = 0) -> None:
        self.header_left, self.pending = header_bytes, b""

    def samples(self, piece: bytes) -> int:
        if self.header_left:
            skip = min(self.header_left, len(piece))
            self.header_left -= skip
            piece = piece[skip:]
        piece = self.pending + piece
        usable = len(piece) - len(piece) % 2
        self.pending = piece[usable:]
        return usable // 2


class OggOpusCounter:
    """Samples (at the model's rate) in the complete Ogg pages of an Opus stream, from their granule
    positions (48 kHz units, minus OpusHead's pre-skip): no decoding on the client."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate, self.buffer, self.pre_skip, self.counted = sample_rate, b"", None, 0

    def samples(self, piece: bytes) -> int:
        self.buffer += piece
        total = self.counted
        while len(self.buffer) >= 27 and len(self.buffer) >= 27 + self.buffer[26]:
            lacing = self.buffer[27:27 + self.buffer[26]]
            size = 27 + len(lacing) + sum(lacing)
            if len(self.buffer) < size:
                break
            page, self.buffer = self.buffer[:size], self.buffer[size:]
            body = page[27 + len(lacing):]
            if body.startswith(b"OpusHead"):
                self.pre_skip = int.from_bytes(body[10:12], "little")
            granule = int.from_bytes(page[6:14], "little", signed=True)
            if self.pre_skip is not None and granule > 0:
                total = max(total, (granule - self.pre_skip) * self.sample_rate // 48000)
        new, self.counted = total - self.counted, total
        return new


COUNTERS = {"pcm": PcmCounter, "opus": OggOpusCounter}


async def one_request(client: httpx.AsyncClient, url: str, route: str, body: dict, counter: object,
                      trace: RequestTrace) -> None:
    """Stream one request; audio arrival times and sample counts go into `trace`."""
    try:
        async with client.stream("POST", f"{url}{route}", json=body) as resp:
            if resp.status_code != 200:
                trace.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return
            async for piece in resp.aiter_bytes():
                now = time.perf_counter()
                samples = counter.samples(piece)
                if samples:
                    trace.add_chunk(now, samples)
        trace.finished = time.perf_counter()
    except (httpx.HTTPError, OSError) as exc:
        trace.error = f"{type(exc).__name__}: {exc}"


async def run_load(url: str, offsets: list[float], body: dict, timeout_s: float, route: str,
                   counter: Callable[[], object]) -> list[RequestTrace]:
    limits = httpx.Limits(max_connections=len(offsets) + 8, max_keepalive_connections=len(offsets) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        # The client's first request pays its own lazy set-up (~35 ms measured): not the server's time.
        await client.get(f"{url}/health")
        start = time.perf_counter()
        traces: list[RequestTrace] = []
        tasks = []
        for i, offset in enumerate(offsets):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            trace = RequestTrace(f"load-{i}", sent=time.perf_counter())
            traces.append(trace)
            tasks.append(asyncio.create_task(one_request(client, url, route, {**body, "seed": i}, counter(), trace)))
        await asyncio.gather(*tasks)
    return traces


def report(traces: list[RequestTrace], sample_rate: int) -> dict:
    s = summarize(traces, sample_rate)
    ttfas = [t for t in (ttfa(tr) for tr in traces if tr.error is None) if t is not None]
    out = asdict(s)
    out.update(ttfa_mean=sum(ttfas) / len(ttfas) if ttfas else float("nan"))
    out["errors"] = sorted({t.error for t in traces if t.error})[:5]
    return out


ROW = "{:>8} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>8}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--rates", default="1,2,4,8", help="requests per second, comma-separated")
    ap.add_argument("--offline", type=int, default=0, help="send N requests at once instead of a rate sweep")
    ap.add_argument("--num-requests", type=int, default=64, help="requests per rate")
    ap.add_argument("--gamma-shape", type=float, default=1.0, help="arrival burstiness (1 = Poisson)")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--endpoint", choices=["generate", "speech"], default="generate",
                    help="POST /generate (a WAV stream) or the OpenAI-compatible POST /v1/audio/speech")
    ap.add_argument("--response-format", choices=sorted(COUNTERS), default="pcm",
                    help="/v1/audio/speech's response_format (opus: samples counted from Ogg granule positions)")
    ap.add_argument("--extra", default="{}", help="JSON fields added to every request (voice, sampling)")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--settings", default="", help="server settings to record (e.g. its command line)")
    ap.add_argument("--out", default=None, help="JSON file for the results")
    args = ap.parse_args()

    info = httpx.get(f"{args.url}/info", timeout=30).json()
    sample_rate = int(info["sample_rate"])
    if args.endpoint == "speech":
        route, counter = "/v1/audio/speech", functools.partial(COUNTERS[args.response_format], sample_rate)
        body = {"model": info["model"], "input": args.text, "response_format": args.response_format}
    else:
        route, counter = "/generate", functools.partial(PcmCounter, sample_rate, WAV_HEADER)
        body = {"text": args.text, "streaming": True}
    body.update(max_tokens=args.max_tokens, ignore_eos=True, **json.loads(args.extra))
    runs = []
    sweeps = [("offline", [0.0] * args.offline)] if args.offline else [
        (rate, arrival_times(args.num_requests, float(rate), args.gamma_shape, args.seed))
        for rate in args.rates.split(",")]
    print(ROW.format("rate", "done", "failed", "ttfa_mean", "ttfa_p50", "ttfa_p90", "ttfa_p95", "ttfa_p99",
                     "viab%", "all%", "underrun", "RTF"))
    for rate, offsets in sweeps:
        traces = asyncio.run(run_load(args.url, offsets, body, args.timeout_s, route, counter))
        r = report(traces, sample_rate)
        r["rate"] = rate
        runs.append(r)
        ms = lambda v: f"{v * 1000:.0f}ms"  # noqa: E731
        print(ROW.format(rate, r["num_completed"], r["num_failed"], ms(r["ttfa_mean"]), ms(r["ttfa_p50"]),
                         ms(r["ttfa_p90"]), ms(r["ttfa_p95"]), ms(r["ttfa_p99"]), f"{r['viability']:.1f}",
                         f"{r['all_chunks']:.1f}", r["underruns"], f"{r['throughput']:.1f}x"), flush=True)
    result = {**environment(), "model": info.get("model"), "settings": args.settings,
              "request": body, "gamma_shape": args.gamma_shape, "runs": runs}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Chunk gaps of running streams while reference clips are encoded (voice cloning, Qwen3-TTS Base).

A replica encodes a cloning request's reference clip (speaker encoder and codec encoder) off the
engine loop, in its prompt thread (`vox_serve/prompt_pool.py`). This runs one replica's scheduler
service in this process, exactly as the scheduler process does: `--streams` requests stream (from a
saved voice, so they run no encoder), then `--clips` cloning requests arrive with clips of
`--clip-seconds` each. It prints, over the running streams, the longest time between consecutive
chunks before the clips came and while they were being encoded (from the first clip's arrival to
the last one's admission), next to the audio length of a chunk. `--inline` builds prompts on the
loop's thread instead (what Engine v2 removed), for comparison.

    python benchmark/clone_gap.py                                   # qwen3-tts-base-tiny on CPU
    python benchmark/clone_gap.py --model qwen3-tts-base --device cuda --load-format dummy --streams 16
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vox_serve import ipc  # noqa: E402
from vox_serve.bench import build_loop, set_cpu_threads  # noqa: E402
from vox_serve.config import ModelConfig, SchedulerConfig, VoxConfig  # noqa: E402
from vox_serve.prompt_pool import PromptPool  # noqa: E402
from vox_serve.scheduler_entry import SchedulerService  # noqa: E402

TEXT = "Thanks for calling. Let me pull up your booking and walk you through the options we have today."
MAX_STEPS = 200_000


def clip(seconds: float, rate: int = 24000, seed: int = 0) -> bytes:
    """A WAV clip shaped like a voice: a wandering pitch with noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    wave = 0.3 * np.sin(2 * np.pi * np.cumsum(pitch) / rate) + 0.03 * rng.standard_normal(t.size)
    buf = io.BytesIO()
    soundfile.write(buf, wave.astype(np.float32), rate, subtype="PCM_16", format="WAV")
    return buf.getvalue()


@dataclass
class Recorder:
    """The service's outgoing messages, with the time each was sent."""

    chunks: dict[str, list[float]] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    voice: bytes | None = None
    failures: list[str] = field(default_factory=list)

    def __call__(self, sent: Any) -> None:
        now = time.perf_counter()
        for msg in ipc.request_events(sent):  # a step's chunks come as one AudioBatch
            self._record(msg, now)

    def _record(self, msg: Any, now: float) -> None:
        if isinstance(msg, ipc.Audio):
            self.chunks.setdefault(msg.req_id, []).append(now)
        elif isinstance(msg, ipc.Started):
            self.started[msg.req_id] = now
        elif isinstance(msg, ipc.VoiceEncoded):
            self.voice = msg.prompt
        elif isinstance(msg, ipc.Finished):
            self.finished.add(msg.req_id)
        elif isinstance(msg, ipc.Failed):
            self.failures.append(f"{msg.req_id}: {msg.message}")
            self.finished.add(msg.req_id)


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest interval between consecutive chunks that overlaps [start, end] (0 if none)."""
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b >= start and a <= end]
    return max(gaps, default=0.0)


def step_until(service: SchedulerService, done: Any) -> None:
    for _ in range(MAX_STEPS):
        if done():
            return
        if service.step() > 0:
            time.sleep(0.001)  # idle: the prompt thread is building
    raise RuntimeError("the service did not get there")


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = VoxConfig(model=ModelConfig(model=args.model, device=args.device, load_format=args.load_format),
                       scheduler=SchedulerConfig(max_batch_size=args.streams + args.clips))
    set_cpu_threads(config)
    loop, program = build_loop(config)
    pool = PromptPool(threads=0 if args.inline else 1, device=str(program.device))
    rec = Recorder()
    service = SchedulerService(loop, program.preprocess, config, rec, prompts=pool,
                               voice_encoder=program.encode_voice)
    service.handle(ipc.EncodeVoice("voice", "bench", 0, None, clip(3.0, seed=1)))
    step_until(service, lambda: rec.voice is not None)
    fields = {"text": TEXT, "max_tokens": args.max_tokens, "ignore_eos": True}
    streams = [f"stream-{i}" for i in range(args.streams)]
    for i, req_id in enumerate(streams):
        service.handle(ipc.Submit(req_id, fields, i, voice_prompt=rec.voice))
    step_until(service, lambda: all(len(rec.chunks.get(r, [])) >= args.warm_chunks for r in streams))
    clips_at = time.perf_counter()
    clips = [f"clip-{i}" for i in range(args.clips)]
    for i, req_id in enumerate(clips):
        service.handle(ipc.Submit(req_id, {**fields, "max_tokens": 8}, 100 + i,
                                  audio=clip(args.clip_seconds, seed=10 + i)))
    step_until(service, lambda: all(r in rec.started or r in rec.finished for r in clips))
    admitted_at = time.perf_counter()
    step_until(service, lambda: all(r in rec.finished for r in streams + clips))
    pool.close()
    if rec.failures:
        raise RuntimeError("; ".join(rec.failures))
    first_chunk = {r: rec.chunks[r][0] for r in streams}
    before = max(longest_gap(rec.chunks[r], first_chunk[r], clips_at) for r in streams)
    during = max(longest_gap(rec.chunks[r], clips_at, admitted_at) for r in streams)
    meta = program.meta
    chunk_s = meta.frames_per_chunk * meta.samples_per_frame / meta.sample_rate
    return {"model": args.model, "device": str(program.device), "inline": args.inline, "streams": args.streams,
            "clips": args.clips, "clip_seconds": args.clip_seconds, "chunk_audio_ms": round(1000 * chunk_s, 1),
            "encoding_window_ms": round(1000 * (admitted_at - clips_at), 1),
            "longest_gap_before_ms": round(1000 * before, 1), "longest_gap_while_encoding_ms": round(1000 * during, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-tts-base-tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--streams", type=int, default=4, help="running streams (from a saved voice)")
    ap.add_argument("--clips", type=int, default=2, help="cloning requests that arrive while they run")
    ap.add_argument("--clip-seconds", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=96, help="frames of each running stream")
    ap.add_argument("--warm-chunks", type=int, default=2, help="chunks every stream has sent before the clips")
    ap.add_argument("--inline", action="store_true", help="build prompts on the loop's thread (for comparison)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    row = run(args)
    print(" ".join(f"{k}={v}" for k, v in row.items()))
    if args.out:
        Path(args.out).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

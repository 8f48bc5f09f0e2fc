"""CPU cost of the speech API's encoders: CPU seconds per second of audio, for every format.

Feeds a model-like stream (24 kHz PCM16 noise shaped like speech, in Orpheus-sized chunks of 2048
samples) through `vox_serve.formats` exactly as a response does (one encoder per stream, chunk by
chunk, then finish), in this process on one thread, and reports the CPU time per audio second and
how many real-time streams one core could encode. Compare it with the server's capacity: at R
audio seconds per wall second over all streams, a format costs R x (CPU s per audio s) cores.

    python benchmark/encode_cost.py --seconds 60 --out encode_cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vox_serve.formats import EncodeOptions  # noqa: E402
from vox_serve.formats.encoders import make_encoder  # noqa: E402

CASES = [("pcm", {}), ("wav", {}), ("mp3", {}), ("opus", {}), ("aac", {}), ("flac", {}), ("mulaw", {}),
         ("pcm", {"sample_rate": 16000}), ("pcm", {"speed": 1.5}), ("opus", {"speed": 1.5})]


def speech_like(seconds: float, rate: int, seed: int = 0) -> bytes:
    """Noise through a moving formant-like band, in syllable-rate bursts: harder to code than a tone."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    carrier = np.sin(2 * np.pi * (300 + 200 * np.sin(2 * np.pi * 0.7 * t)) * t)
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)
    signal = (0.6 * carrier + 0.4 * rng.standard_normal(n)) * envelope
    return (np.clip(signal, -1, 1) * 12000).astype("<i2").tobytes()


def cost(fmt: str, options: dict, pcm: bytes, rate: int, chunk_samples: int) -> dict:
    encoder = make_encoder(EncodeOptions.parse(fmt, **options), rate)
    chunk = 2 * chunk_samples
    start, wall = time.process_time(), time.perf_counter()
    size = sum(len(encoder.encode(pcm[i:i + chunk])) for i in range(0, len(pcm), chunk)) + len(encoder.finish())
    cpu, wall = time.process_time() - start, time.perf_counter() - wall
    seconds = len(pcm) / 2 / rate
    return {"format": fmt, **options, "audio_s": seconds, "cpu_s": cpu, "wall_s": wall,
            "cpu_s_per_audio_s": cpu / seconds, "realtime_streams_per_core": seconds / cpu if cpu else float("inf"),
            "kbit_per_s": size * 8 / seconds / 1000}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="audio per format")
    ap.add_argument("--rate", type=int, default=24000)
    ap.add_argument("--chunk-samples", type=int, default=2048, help="samples per chunk (Orpheus: 2048)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch  # only to pin one thread, like a server under load

    torch.set_num_threads(1)
    pcm = speech_like(args.seconds, args.rate)
    rows = [cost(fmt, options, pcm, args.rate, args.chunk_samples) for fmt, options in CASES]
    print(f"{'format':<22} {'cpu ms / audio s':>17} {'streams / core':>15} {'kbit/s':>8}")
    for r in rows:
        name = r["format"] + "".join(f" {k}={v}" for k, v in r.items() if k in ("sample_rate", "speed"))
        print(f"{name:<22} {r['cpu_s_per_audio_s'] * 1000:17.2f} {r['realtime_streams_per_core']:15.0f} "
              f"{r['kbit_per_s']:8.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

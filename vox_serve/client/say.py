"""`vox-serve say "text" -o out.mp3`: speech from a running server, written as it streams in."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

from vox_serve.client.errors import VoxError
from vox_serve.client.http import DEFAULT_URL, VoxClient

FORMATS = ("wav", "pcm", "mp3", "opus", "aac", "flac", "mulaw")
SUFFIXES = {".ogg": "opus", ".oga": "opus", ".ulaw": "mulaw", ".raw": "pcm", ".m4a": "aac"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vox-serve say", description="Speak text with a running vox-serve server.")
    parser.add_argument("text", help="the text to speak ('-': read it from stdin)")
    parser.add_argument("-o", "--output", required=True, help="output file ('-': stdout); its suffix picks the "
                                                              "format unless --format is given")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the server (default {DEFAULT_URL})")
    parser.add_argument("--voice", default=None, help="a built-in or saved voice (GET /v1/audio/voices)")
    parser.add_argument("--format", choices=FORMATS, default=None, help="audio format (default: from the suffix, "
                                                                        "else wav)")
    parser.add_argument("--speed", type=float, default=None, help="0.25 to 4.0, pitch kept")
    parser.add_argument("--sample-rate", type=int, default=None, help="output sample rate in Hz")
    parser.add_argument("--fields", default="{}", help='more request fields as JSON, e.g. \'{"seed": 7}\'')
    return parser


def output_format(path: str, given: str | None) -> str:
    if given is not None:
        return given
    suffix = Path(path).suffix.lower()
    return SUFFIXES.get(suffix) or (suffix[1:] if suffix[1:] in FORMATS else "wav")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    text = sys.stdin.read() if args.text == "-" else args.text
    try:
        fields = json.loads(args.fields)
    except json.JSONDecodeError as exc:
        print(f"vox-serve say: --fields is not JSON: {exc}", file=sys.stderr)
        return 2
    fmt = output_format(args.output, args.format)
    out = sys.stdout.buffer if args.output == "-" else open(args.output, "wb")  # noqa: SIM115
    try:
        with VoxClient(args.url) as client:
            for piece in client.stream_speech(text, args.voice, fmt, args.speed, args.sample_rate, **fields):
                out.write(piece)
                out.flush()
    except VoxError as exc:
        print(f"vox-serve say: the server refused: {exc.message}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"vox-serve say: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    return 0

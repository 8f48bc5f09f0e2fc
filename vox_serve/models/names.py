"""The model names `--model` accepts, without importing any model code (the CLI checks names with it).

A name is a registry name, a local checkpoint directory, or a Hugging Face id (`owner/name`, found
in the local cache). Anything else is most likely a typo of a registry name, and is refused with
the nearest names instead of being read as a checkpoint to look for.
"""

from __future__ import annotations

import difflib
from pathlib import Path

# registry name -> model family (models/registry.py builds each family)
NAMES: dict[str, str] = {
    "orpheus": "orpheus", "orpheus-tiny": "orpheus", "canopylabs/orpheus-3b-0.1-ft": "orpheus",
    "qwen3-tts": "qwen3-tts", "qwen3-tts-tiny": "qwen3-tts", "qwen3-tts-base": "qwen3-tts",
    "qwen3-tts-base-tiny": "qwen3-tts", "qwen3-tts-voice-design": "qwen3-tts",
    "qwen3-tts-0.6b": "qwen3-tts", "qwen3-tts-base-0.6b": "qwen3-tts",
    "zonos": "zonos", "zonos-tiny": "zonos", "Zyphra/Zonos-v0.1-transformer": "zonos",
}


def model_name_problem(name: str) -> str | None:
    """None for a name `--model` can take, else what is wrong with it (with the nearest names)."""
    if name in NAMES or "/" in name.strip("/") or Path(name).expanduser().exists():
        return None
    close = difflib.get_close_matches(name.lower(), list(NAMES), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return (f"unknown model {name!r}: {hint}--model takes one of {', '.join(NAMES)}, a local checkpoint "
            "directory, or a Hugging Face id (owner/name) in the local cache")

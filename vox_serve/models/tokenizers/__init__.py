"""Tokenizers: the files checkpoints ship, and ones built in code for checkpoints that ship none."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from vox_serve.rt.checkpoint import CheckpointError


def load_tokenizer_json(model_dir: Path) -> Tokenizer:
    """A checkpoint's `tokenizer.json`; CheckpointError when it has none."""
    path = model_dir / "tokenizer.json"
    if not path.exists():
        raise CheckpointError(f"{path} is missing")
    return Tokenizer.from_file(str(path))

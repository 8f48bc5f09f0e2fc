"""Model registry: names -> program builders. Adding a model touches its own files and this table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from vox_serve.models.names import NAMES
from vox_serve.rt.checkpoint import CheckpointError, read_json, resolve_local
from vox_serve.rt.program import Program


@dataclass(frozen=True)
class BuildArgs:
    name: str
    load_format: str
    device: torch.device
    dtype: torch.dtype
    seed: int
    max_model_len: int | None
    codec_path: str | None


@dataclass(frozen=True)
class ModelFamily:
    name: str
    default_max_model_len: int
    build: Callable[[BuildArgs], Program]


def _build_orpheus(a: BuildArgs) -> Program:
    from vox_serve.models.orpheus.loader import load_orpheus

    return load_orpheus(a.name, a.load_format, a.device, a.dtype, a.seed,
                        a.max_model_len or FAMILIES["orpheus"].default_max_model_len, a.codec_path)


def _build_qwen3_tts(a: BuildArgs) -> Program:
    from vox_serve.models.qwen3_tts.loader import load_qwen3_tts

    return load_qwen3_tts(a.name, a.load_format, a.device, a.dtype, a.seed,
                          a.max_model_len or FAMILIES["qwen3-tts"].default_max_model_len, a.codec_path)


def _build_zonos(a: BuildArgs) -> Program:
    from vox_serve.models.zonos.loader import load_zonos

    return load_zonos(a.name, a.load_format, a.device, a.dtype, a.seed,
                      a.max_model_len or FAMILIES["zonos"].default_max_model_len, a.codec_path)


FAMILIES: dict[str, ModelFamily] = {
    "orpheus": ModelFamily("orpheus", 4096, _build_orpheus),
    "qwen3-tts": ModelFamily("qwen3-tts", 4096, _build_qwen3_tts),
    "zonos": ModelFamily("zonos", 4096, _build_zonos),
}


def family_of(name: str) -> ModelFamily:
    """The family of a registry name, a local checkpoint directory or a cached Hugging Face id."""
    if name in NAMES:
        return FAMILIES[NAMES[name]]
    if "orpheus" in name.lower():
        return FAMILIES["orpheus"]
    if "qwen3-tts" in name.lower():
        return FAMILIES["qwen3-tts"]
    if "zonos" in name.lower():
        return FAMILIES["zonos"]
    local = resolve_local(name)
    if local is not None and (Path(local) / "config.json").exists():
        cfg = read_json(Path(local) / "config.json")
        if "LlamaForCausalLM" in cfg.get("architectures", []) and cfg.get("vocab_size", 0) >= 156940:
            return FAMILIES["orpheus"]
        if cfg.get("model_type") == "qwen3_tts":
            return FAMILIES["qwen3-tts"]
        if "backbone" in cfg and "prefix_conditioner" in cfg:  # Zonos v0.1 (no model_type in its config)
            return FAMILIES["zonos"]
    raise CheckpointError(f"unknown model {name!r}; known: {', '.join(sorted(NAMES))}, or an Orpheus or "
                          "Qwen3-TTS or Zonos checkpoint dir")


def build_program(args: BuildArgs) -> Program:
    return family_of(args.name).build(args)

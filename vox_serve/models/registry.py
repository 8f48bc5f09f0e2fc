"""Model registry: names -> program builders. Adding a model touches its own files and this table."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import torch

from vox_serve.config import ConfigError
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
    codec_dtype: torch.dtype | None = None  # None: `dtype`


@dataclass(frozen=True)
class ModelFamily:
    """A model family: its loader (`module:function`, imported when first built, so a server loads only
    the code of the model it serves), the context length used when --max-model-len is not given, and whether
    its loader takes a `codec_dtype` other than the model's (--codec-dtype)."""

    name: str
    default_max_model_len: int
    loader: str
    own_codec_dtype: bool = False

    def build(self, a: BuildArgs) -> Program:
        module, function = self.loader.split(":")
        load = getattr(importlib.import_module(module), function)
        extra = {}
        if a.codec_dtype not in (None, a.dtype):
            if not self.own_codec_dtype:
                raise ConfigError(f"--codec-dtype: {self.name}'s codec runs in the model's dtype ({a.dtype}); "
                                  "only orpheus takes another")
            extra["codec_dtype"] = a.codec_dtype
        return load(a.name, a.load_format, a.device, a.dtype, a.seed, a.max_model_len or self.default_max_model_len,
                    a.codec_path, **extra)


FAMILIES: dict[str, ModelFamily] = {
    "orpheus": ModelFamily("orpheus", 4096, "vox_serve.models.orpheus.loader:load_orpheus", own_codec_dtype=True),
    "qwen3-tts": ModelFamily("qwen3-tts", 4096, "vox_serve.models.qwen3_tts.loader:load_qwen3_tts"),
    "zonos": ModelFamily("zonos", 4096, "vox_serve.models.zonos.loader:load_zonos"),
    # the released backbone's max_position_embeddings
    "csm": ModelFamily("csm", 2048, "vox_serve.models.csm.loader:load_csm"),
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
        if cfg.get("model_type") == "csm":
            return FAMILIES["csm"]
    raise CheckpointError(f"unknown model {name!r}; known: {', '.join(sorted(NAMES))}, or an Orpheus, "
                          "Qwen3-TTS, Zonos or CSM checkpoint dir")


def build_program(args: BuildArgs) -> Program:
    return family_of(args.name).build(args)

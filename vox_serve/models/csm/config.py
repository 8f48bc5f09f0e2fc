"""CSM's config.json (transformers `CsmConfig` as `save_pretrained` writes it, 4.x or 5.x rope dialect)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vox_serve.codecs.mimi.config import MimiConfig
from vox_serve.layers.llama import LlamaConfig


@dataclass(frozen=True)
class CsmTokenIds:
    """Special ids: text (the Llama-3 vocabulary) and codebook (per-codebook vocabulary of `vocab_size`)."""

    bos: int  # <|begin_of_text|>, opens every turn
    audio: int  # <|AUDIO|>: one position per context audio frame (the text column is absent there)
    audio_eos: int  # <|audio_eos|>: closes a context turn's audio, embedded as an all-eos frame
    codebook_eos: int  # 0: a code like any other, and the stop frame's value
    codebook_pad: int  # 2050: never fed (transformers pads finished rows of a batch with it)


@dataclass(frozen=True)
class CsmConfig:
    backbone: LlamaConfig  # vocab_size: the codebook vocabulary (lm_head predicts codebook 0)
    depth: LlamaConfig  # the depth decoder; vocab_size the same codebook vocabulary
    text_vocab_size: int
    num_codebooks: int
    tie_codebooks_embeddings: bool  # the backbone's audio embedding is the depth decoder's (absent from the file)
    ids: CsmTokenIds
    codec: MimiConfig

    @property
    def codebook_vocab(self) -> int:
        return self.backbone.vocab_size

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> CsmConfig:
        """Raises ValueError naming the setting for a config this implementation does not cover."""
        if cfg.get("model_type", "csm") != "csm":
            raise ValueError(f"config.json: model_type {cfg['model_type']!r} is not 'csm'")
        depth_cfg, codec_cfg = cfg.get("depth_decoder_config"), cfg.get("codec_config")
        if not isinstance(depth_cfg, dict) or not isinstance(codec_cfg, dict):
            raise ValueError("config.json: a CSM config needs depth_decoder_config and codec_config")
        for where, sub in (("", cfg), ("depth_decoder_config.", depth_cfg)):
            _check_plain_llama(where, sub)
        num_codebooks = cfg.get("num_codebooks", 32)
        config = cls(
            backbone=LlamaConfig.from_hf(cfg), depth=LlamaConfig.from_hf(depth_cfg),
            text_vocab_size=cfg.get("text_vocab_size", 128256), num_codebooks=num_codebooks,
            tie_codebooks_embeddings=bool(cfg.get("tie_codebooks_embeddings", True)),
            ids=CsmTokenIds(bos=_id(cfg, "bos_token_id", 128000), audio=_id(cfg, "audio_token_id", 128002),
                            audio_eos=_id(cfg, "audio_eos_token_id", 128003),
                            codebook_eos=_id(cfg, "codebook_eos_token_id", 0),
                            codebook_pad=_id(cfg, "codebook_pad_token_id", 2050)),
            codec=MimiConfig.from_dict(codec_cfg))
        config.check(depth_cfg)
        return config

    def check(self, depth_cfg: dict[str, Any]) -> None:
        k = self.num_codebooks
        if depth_cfg.get("num_codebooks", k) != k:
            raise ValueError(f"config.json: depth_decoder_config.num_codebooks {depth_cfg['num_codebooks']} != {k}")
        if depth_cfg.get("backbone_hidden_size", self.backbone.hidden_size) != self.backbone.hidden_size:
            raise ValueError("config.json: depth_decoder_config.backbone_hidden_size differs from hidden_size")
        if self.depth.vocab_size != self.codebook_vocab:
            raise ValueError("config.json: depth_decoder_config.vocab_size differs from vocab_size")
        if self.codec.num_quantizers != k or self.codec.codebook_size > self.codebook_vocab:
            raise ValueError(f"config.json: codec_config has {self.codec.num_quantizers} codebooks of "
                             f"{self.codec.codebook_size}; the model takes {k} of {self.codebook_vocab}")


def _check_plain_llama(where: str, cfg: dict[str, Any]) -> None:
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json: {where}hidden_act {cfg['hidden_act']!r} is not supported (only 'silu')")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise ValueError(f"config.json: {where}{key} is not supported")


def _id(cfg: dict[str, Any], key: str, default: int) -> int:
    value = cfg.get(key, default)
    if isinstance(value, list):  # transformers allows a list of eos ids; CSM's are single
        value = value[0]
    return default if value is None else int(value)

"""Building the Qwen3-TTS program: the 1.7B and tiny configurations, checkpoint loading, dummy weights.

A checkpoint directory is the published layout: `config.json` (a `qwen3_tts` config with its
`talker_config`, and for Base its `speaker_encoder_config`), `model.safetensors` (Base: with the
`speaker_encoder.*` weights), the Qwen2 tokenizer files, and `speech_tokenizer/` (the 12 Hz codec:
decoder, and the encoder Base uses for reference audio; `--codec-path` overrides it). Nothing is
downloaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from vox_serve.codecs.qwen3.decoder import Qwen3CodecConfig, Qwen3CodecDecoder
from vox_serve.models.qwen3_tts.clone import load_cloner
from vox_serve.models.qwen3_tts.layers import CodePredictor, DecoderConfig, Talker
from vox_serve.models.qwen3_tts.program import Qwen3TTSProgram, qwen3_tts_meta
from vox_serve.models.qwen3_tts.prompt import PromptIds
from vox_serve.models.tokenizers.qwen2 import load_qwen2_tokenizer, tiny_qwen2_tokenizer
from vox_serve.models.tokenizers.user_text import for_user_text
from vox_serve.rt.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    copy_weights,
    fused_decoder_weights,
    init_random,
    iter_safetensors,
    read_json,
)

QWEN3_TTS_ID = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
# Registry short names of the published checkpoints.
QWEN3_TTS_IDS = {
    "qwen3-tts": QWEN3_TTS_ID, "qwen3-tts-base": "Qwen/Qwen3-TTS-12Hz-1.7B-Base",
    "qwen3-tts-voice-design": "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
    "qwen3-tts-0.6b": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", "qwen3-tts-base-0.6b": "Qwen/Qwen3-TTS-12Hz-0.6B-Base",
}

_PREDICTOR = {
    "vocab_size": 2048, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 5,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 65536, "num_code_groups": 16, "hidden_act": "silu",
}
# The released 1.7B CustomVoice geometry and ids (used for --load-format dummy; a checkpoint's own
# config.json always wins).
QWEN3_TTS_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_tts", "tts_model_type": "custom_voice", "tts_model_size": "1b7",
    "tokenizer_type": "qwen3_tts_tokenizer_12hz", "im_start_token_id": 151644, "im_end_token_id": 151645,
    "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
    "talker_config": {
        "vocab_size": 3072, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True},
        "num_code_groups": 16, "text_hidden_size": 2048, "text_vocab_size": 151936,
        "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155, "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149,
        "codec_language_id": {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
                              "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
                              "beijing_dialect": 2074, "sichuan_dialect": 2062},
        "spk_id": {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
                   "sohee": 2864, "eric": 2875, "dylan": 2878},
        "spk_is_dialect": {"serena": False, "vivian": False, "uncle_fu": False, "ryan": False, "aiden": False,
                           "ono_anna": False, "sohee": False, "eric": "sichuan_dialect", "dylan": "beijing_dialect"},
        "code_predictor_config": _PREDICTOR,
    },
}
# Ids and vocabularies of the real model kept (3072 codec ids, the Qwen2 text vocabulary, real speaker /
# language ids), 4 code groups, everything else shrunk. Also the shape of the tests' reference checkpoint.
QWEN3_TTS_TINY_CONFIG: dict[str, Any] = {
    **QWEN3_TTS_CONFIG, "tts_model_size": "tiny",
    "talker_config": {
        **QWEN3_TTS_CONFIG["talker_config"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2], "interleaved": True},
        "num_code_groups": 4, "text_hidden_size": 32,
        "codec_language_id": {"chinese": 2055, "english": 2050, "japanese": 2058, "sichuan_dialect": 2062},
        "spk_id": {"vivian": 3065, "ryan": 3061, "eric": 2875},
        "spk_is_dialect": {"vivian": False, "ryan": False, "eric": "sichuan_dialect"},
        "code_predictor_config": {
            **_PREDICTOR, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "rope_theta": 10000.0,
            "max_position_embeddings": 64, "num_code_groups": 4,
        },
    },
}
# The Base model: no named speakers; an ECAPA speaker encoder whose embedding is as wide as the talker.
QWEN3_TTS_TINY_BASE_CONFIG: dict[str, Any] = {
    **QWEN3_TTS_TINY_CONFIG, "tts_model_type": "base",
    "talker_config": {**QWEN3_TTS_TINY_CONFIG["talker_config"], "spk_id": {}, "spk_is_dialect": {}},
    "speaker_encoder_config": {
        "mel_dim": 128, "enc_dim": 64, "enc_channels": [32, 32, 32, 32, 96], "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 16, "enc_res2net_scale": 4,
        "enc_se_channels": 16, "sample_rate": 24000,
    },
}
# A tiny 12 Hz codec of the real frame geometry (1920 samples) for the tiny programs; its Mimi encoder
# keeps twice the talker's quantizers, as the released one does (32 for 16 code groups).
TINY_CODEC_CONFIG: dict[str, Any] = {
    "encoder_valid_num_quantizers": 4,
    "encoder_config": {
        "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "intermediate_size": 32, "num_filters": 4, "codebook_size": 2048, "codebook_dim": 8,
        "vector_quantization_hidden_dimension": 8, "num_quantizers": 8, "num_semantic_quantizers": 1,
    },
    "decoder_config": {
        "codebook_size": 2048, "num_quantizers": 4, "codebook_dim": 16, "latent_dim": 16, "hidden_size": 16,
        "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 32, "num_hidden_layers": 1,
        "sliding_window": 8, "decoder_dim": 16, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
    },
}


TINY_CONFIGS = {"qwen3-tts-tiny": QWEN3_TTS_TINY_CONFIG, "qwen3-tts-base-tiny": QWEN3_TTS_TINY_BASE_CONFIG}


def build_modules(cfg: dict[str, Any], device: torch.device, max_model_len: int) -> tuple[Talker, CodePredictor]:
    t = cfg["talker_config"]
    groups = t["num_code_groups"]
    pred_cfg = t["code_predictor_config"]
    if pred_cfg.get("num_code_groups", groups) != groups:
        raise CheckpointError("config.json: talker and code predictor disagree on num_code_groups")
    talker_cfg, predictor_cfg = DecoderConfig.from_hf(t), DecoderConfig.from_hf(pred_cfg)
    with torch.device(device):
        talker = Talker(talker_cfg, t["text_vocab_size"], t["text_hidden_size"], predictor_cfg.vocab_size, groups,
                        max_positions=max_model_len)
        predictor = CodePredictor(predictor_cfg, talker_cfg.hidden_size, groups)
    return talker, predictor


def load_weights(talker: Talker, predictor: CodePredictor, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load the reference's weight names (`talker.*`; the Base model's `speaker_encoder.*` is skipped),
    fusing q/k/v and gate/up, stacking the code tables and heads; raises on missing or extra keys."""
    pending = {name: t for name, t in tensors if not name.startswith("speaker_encoder.")}

    def take(name: str) -> torch.Tensor:
        if name not in pending:
            raise CheckpointError(f"checkpoint is missing {name}")
        return pending.pop(name)

    groups = talker.num_code_groups
    values = {
        **fused_decoder_weights(take, "talker.model.", "talker.", talker.cfg.num_layers, qk_norm=True),
        **fused_decoder_weights(take, "talker.code_predictor.model.", "predictor.", predictor.cfg.num_layers,
                                qk_norm=True),
        "talker.codec_tables": torch.cat(
            [take("talker.model.codec_embedding.weight")]
            + [take(f"talker.code_predictor.model.codec_embedding.{g}.weight") for g in range(groups - 1)]),
        "predictor.heads": torch.stack([take(f"talker.code_predictor.lm_head.{g}.weight") for g in range(groups - 1)]),
        "talker.text_embedding.weight": take("talker.model.text_embedding.weight"),
        "talker.codec_head.weight": take("talker.codec_head.weight"),
    }
    for i in (1, 2):
        for leaf in ("weight", "bias"):
            values[f"talker.text_fc{i}.{leaf}"] = take(f"talker.text_projection.linear_fc{i}.{leaf}")
    if isinstance(predictor.in_proj, torch.nn.Linear):
        for leaf in ("weight", "bias"):
            values[f"predictor.in_proj.{leaf}"] = take(f"talker.code_predictor.small_to_mtp_projection.{leaf}")
    if pending:
        raise CheckpointError(f"checkpoint has unexpected weights {sorted(pending)[:8]}")
    copy_weights({f"talker.{k}": p for k, p in talker.named_parameters()}
               | {f"predictor.{k}": p for k, p in predictor.named_parameters()}, values)


def _codec_dir(model_dir: Path | None, codec_path: str | None) -> Path | None:
    """The 12 Hz codec: `--codec-path`, the checkpoint's `speech_tokenizer/`, or None (random weights)."""
    path = Path(codec_path) if codec_path else (model_dir / "speech_tokenizer" if model_dir is not None else None)
    if path is not None and not (path / "config.json").exists():
        raise CheckpointError(f"no Qwen3-TTS codec at {path} (needs config.json + model.safetensors); "
                              "pass --codec-path DIR")
    return path


def _codec(path: Path | None, tiny: bool, device: torch.device, dtype: torch.dtype, seed: int) -> Qwen3CodecDecoder:
    if path is None:
        config = Qwen3CodecConfig.from_dict(TINY_CODEC_CONFIG) if tiny else Qwen3CodecConfig()
        return Qwen3CodecDecoder.random(config, seed, device, dtype)
    return Qwen3CodecDecoder.from_dir(str(path), device=device, dtype=dtype)


def dummy_config(repo: str) -> dict[str, Any]:
    """The published geometry named by a Hugging Face id (0.6B or 1.7B; CustomVoice, VoiceDesign or Base)."""
    cfg = {**QWEN3_TTS_CONFIG, "talker_config": dict(QWEN3_TTS_CONFIG["talker_config"])}
    if "voicedesign" in repo.lower():
        cfg["tts_model_type"] = "voice_design"
    if "0.6b" in repo.lower():
        cfg["tts_model_size"] = "0b6"
        cfg["talker_config"].update(hidden_size=1024, intermediate_size=3072)
    if repo.lower().endswith("-base"):  # the speaker embedding is as wide as the talker
        cfg["tts_model_type"] = "base"
        cfg["speaker_encoder_config"] = {"enc_dim": cfg["talker_config"]["hidden_size"]}
    return cfg


def load_qwen3_tts(name: str, load_format: str, device: torch.device, dtype: torch.dtype, seed: int,
                   max_model_len: int, codec_path: str | None = None) -> Qwen3TTSProgram:
    """The Qwen3-TTS program for a registry name, a local checkpoint dir or a cached HF id."""
    model_dir: Path | None = None
    tiny = name in TINY_CONFIGS
    if tiny:
        cfg = TINY_CONFIGS[name]
    else:
        repo = QWEN3_TTS_IDS.get(name, name)
        model_dir = checkpoint_dir(repo, load_format)
        cfg = dummy_config(repo) if model_dir is None else read_json(model_dir / "config.json")
    ids = PromptIds.from_config(cfg)
    talker, predictor = build_modules(cfg, device, max_model_len)
    if model_dir is None:
        init_random(talker, seed)
        init_random(predictor, seed + 1)
        tokenizer = for_user_text(tiny_qwen2_tokenizer())
    else:
        load_weights(talker, predictor, iter_safetensors(model_dir))
        tokenizer = for_user_text(load_qwen2_tokenizer(model_dir))
    codec_dir = _codec_dir(model_dir, codec_path)
    codec = _codec(codec_dir, tiny, device, dtype, seed + 2)
    if codec.config.num_quantizers != ids.num_code_groups:
        raise CheckpointError(f"the codec has {codec.config.num_quantizers} quantizers, the talker "
                              f"{ids.num_code_groups} code groups")
    cloner = None
    if ids.model_type == "base":
        codec_encoder_config = TINY_CODEC_CONFIG if tiny else None
        cloner = load_cloner(cfg, model_dir, codec_dir, codec_encoder_config, ids.num_code_groups, device, seed + 3)
    meta = qwen3_tts_meta(name, ids, max_model_len, talker.cfg.hidden_size,
                          samples_per_frame=codec.config.samples_per_frame)
    return Qwen3TTSProgram(talker.to(dtype).eval(), predictor.to(dtype).eval(), codec, tokenizer, ids, meta,
                           device, dtype, cloner, prompt_config=cfg)

"""Building the Orpheus program: the 3B and tiny configurations, checkpoint loading, dummy weights.

A checkpoint directory is the published layout: `config.json`, `*.safetensors`, `tokenizer.json`;
the SNAC decoder comes from `--codec-path`, a `snac/` (or `snac_24khz/`) folder inside the
checkpoint, or the local Hugging Face cache of hubertsiuzdak/snac_24khz. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vox_serve.codecs.snac import SnacConfig, SnacDecoder
from vox_serve.layers.llama import LlamaConfig, LlamaForCausalLM
from vox_serve.models.orpheus.program import OrpheusProgram, orpheus_meta
from vox_serve.models.tokenizers import load_tokenizer_json
from vox_serve.models.tokenizers.byte_level import byte_level_tokenizer
from vox_serve.models.tokenizers.user_text import for_user_text
from vox_serve.rt.checkpoint import (
    CheckpointError,
    checkpoint_dir,
    init_random,
    iter_safetensors,
    read_json,
    resolve_local,
)

ORPHEUS_3B_ID = "canopylabs/orpheus-3b-0.1-ft"
SNAC_24KHZ_ID = "hubertsiuzdak/snac_24khz"

ORPHEUS_3B_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 156940, "hidden_size": 3072,
    "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
    "tie_word_embeddings": True, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
# Same token layout as the 3B model (the vocabulary is kept), everything else shrunk.
ORPHEUS_TINY_CONFIG: dict[str, Any] = {
    **ORPHEUS_3B_CONFIG, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
}
SNAC_24KHZ_CONFIG: dict[str, Any] = {
    "sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096, "codebook_dim": 8,
    "vq_strides": [4, 2, 1], "noise": True, "depthwise": True,
}
SNAC_TINY_CONFIG: dict[str, Any] = {**SNAC_24KHZ_CONFIG, "encoder_dim": 8, "decoder_dim": 64}


def _find_snac(model_dir: Path | None, codec_path: str | None) -> Path:
    candidates = [Path(codec_path)] if codec_path else []
    if model_dir is not None:
        candidates += [model_dir / "snac", model_dir / "snac_24khz"]
    for c in candidates:
        if (c / "config.json").exists():
            return c
    cached = resolve_local(SNAC_24KHZ_ID)
    if cached is not None and not codec_path:
        return cached
    raise CheckpointError(
        f"no SNAC decoder found (looked in {', '.join(map(str, candidates)) or 'nothing'} and the local "
        f"cache of {SNAC_24KHZ_ID}); pass --codec-path DIR or use --load-format dummy"
    )


def load_orpheus(name: str, load_format: str, device: torch.device, dtype: torch.dtype, seed: int,
                 max_model_len: int, codec_path: str | None = None,
                 constrain_audio: bool = True, codec_dtype: torch.dtype | None = None) -> OrpheusProgram:
    """Build the Orpheus program for a registry name, a local checkpoint dir or a cached HF id; SNAC in
    `codec_dtype` (default: the LM's `dtype`; bfloat16 is within 30 dB SNR of float32, tests/test_snac_codec.py)."""
    model_dir: Path | None = None
    snac_dtype = codec_dtype or dtype
    if name == "orpheus-tiny":
        lm_cfg_dict, snac_cfg_dict = ORPHEUS_TINY_CONFIG, SNAC_TINY_CONFIG
    else:
        repo = ORPHEUS_3B_ID if name == "orpheus" else name
        model_dir = checkpoint_dir(repo, load_format)
        lm_cfg_dict = ORPHEUS_3B_CONFIG if model_dir is None else read_json(model_dir / "config.json")
        snac_cfg_dict = SNAC_24KHZ_CONFIG
    lm_cfg = LlamaConfig.from_hf(lm_cfg_dict)
    with torch.device(device):
        lm = LlamaForCausalLM(lm_cfg, max_positions=max_model_len)
    if model_dir is None:
        init_random(lm, seed)
        snac = SnacDecoder.random(SnacConfig.from_dict(snac_cfg_dict), seed=seed + 1, device=device, dtype=snac_dtype)
        tokenizer = for_user_text(byte_level_tokenizer())
    else:
        lm.load_hf_weights(iter_safetensors(model_dir))
        snac = SnacDecoder.from_dir(str(_find_snac(model_dir, codec_path)), device=device, dtype=snac_dtype)
        tokenizer = for_user_text(load_tokenizer_json(model_dir))
    lm = lm.to(dtype).eval()
    meta = orpheus_meta(name, max_model_len, constrain_audio)
    return OrpheusProgram(lm_cfg, lm, snac, tokenizer, meta, device, dtype)

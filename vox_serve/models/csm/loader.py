"""Loading CSM: config.json + *.safetensors in the transformers `CsmForConditionalGeneration` file layout,
strictly (a missing or unexpected weight is an error), or random weights of the same shapes.

File layout (what `save_pretrained` writes, not the in-memory `state_dict()`): `embed_text_tokens`,
`backbone_model.layers.N.*` / `.norm`, `lm_head`, `depth_decoder.model.{embed_tokens, inputs_embeds_projector,
layers.N.*, norm}`, `depth_decoder.codebooks_head` [K-1, hidden, vocab], and Mimi under `codec_model.*` in its
flat layout. With `tie_codebooks_embeddings` (the released model) the backbone's
`backbone_model.embed_tokens.embed_audio_tokens.weight` is the depth decoder's `embed_tokens` and absent from
the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vox_serve.codecs.mimi.decoder import MimiDecoder
from vox_serve.codecs.mimi.encoder import MimiEncoder
from vox_serve.layers.depth import DepthTransformer
from vox_serve.models.csm.config import CsmConfig
from vox_serve.models.csm.layers import CsmBackbone, depth_decoder
from vox_serve.models.csm.program import CsmProgram, csm_meta, sampling_defaults
from vox_serve.models.csm.prompt import PromptIds
from vox_serve.models.tokenizers import load_tokenizer_json
from vox_serve.models.tokenizers.byte_level import CSM_SPECIAL_TOKENS, byte_level_tokenizer
from vox_serve.models.tokenizers.user_text import for_user_text
from vox_serve.rt.checkpoint import (
    CheckpointError,
    TensorPool,
    checkpoint_dir,
    copy_weights,
    fused_decoder_weights,
    init_random,
    iter_safetensors,
    read_json,
)

CSM_1B_ID = "sesame/csm-1b"
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
# The released geometry (Llama-3.2-1B backbone, a 4-layer depth decoder, Mimi with 32 codebooks), for
# --load-format dummy; a checkpoint's config.json always wins. Rope scaling as Sesame's Llama 3.2 builders
# set it (torchtune's defaults; not checked against the published config.json here).
CSM_1B_CONFIG: dict[str, Any] = {
    "model_type": "csm", "num_codebooks": 32, "vocab_size": 2051, "text_vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "rope_theta": 500000.0,
    "rope_scaling": _LLAMA3_ROPE, "bos_token_id": 128000, "audio_token_id": 128002, "audio_eos_token_id": 128003,
    "codebook_eos_token_id": 0, "codebook_pad_token_id": 2050, "tie_codebooks_embeddings": True,
    "depth_decoder_config": {
        "num_codebooks": 32, "backbone_hidden_size": 2048, "vocab_size": 2051, "hidden_size": 1024,
        "intermediate_size": 8192, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 33, "rope_theta": 500000.0,
        "rope_scaling": _LLAMA3_ROPE,
    },
    "codec_config": {"model_type": "mimi", "num_quantizers": 32},
}
# Everything but the token ids, the 2051-id codebook vocabulary, the 32 codebooks and Mimi's frame geometry
# shrunk; also the shape of the tests' reference checkpoint.
CSM_TINY_CONFIG: dict[str, Any] = {
    **CSM_1B_CONFIG, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16,
    "depth_decoder_config": {
        **CSM_1B_CONFIG["depth_decoder_config"], "backbone_hidden_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8,
    },
    "codec_config": {
        "model_type": "mimi", "hidden_size": 16, "num_filters": 4, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 32, "codebook_size": 2048, "codebook_dim": 8,
        "vector_quantization_hidden_dimension": 8, "num_quantizers": 32, "sliding_window": 8, "upsample_groups": 16,
    },
}
TIED_AUDIO_EMBEDDING = "backbone_model.embed_tokens.embed_audio_tokens.weight"


@dataclass
class CsmModules:
    config: CsmConfig
    backbone: CsmBackbone
    depth: DepthTransformer
    codec: MimiDecoder
    codec_encoder: MimiEncoder  # context audio given as a clip -> codes

    def to(self, device: torch.device, dtype: torch.dtype) -> CsmModules:
        """The LM and the decoder in `dtype`; the encoder stays float32 (it runs once per clip)."""
        self.backbone, self.depth = self.backbone.to(device, dtype).eval(), self.depth.to(device, dtype).eval()
        self.codec = self.codec.to(device, dtype).eval()
        self.codec_encoder = self.codec_encoder.to(device).eval()
        return self


def build_modules(config: CsmConfig, max_positions: int, device: torch.device | str = "cpu") -> CsmModules:
    with torch.device(device):
        backbone, depth = CsmBackbone(config, max_positions), depth_decoder(config)
        codec = MimiDecoder(config.codec)
        # transformers 5 (CSM's reference) applies Mimi's sliding window in the encoder too.
        encoder = MimiEncoder(config.codec, attention_window=config.codec.sliding_window)
    return CsmModules(config, backbone, depth, codec, encoder)


def load_csm_dir(model_dir: Path, max_positions: int) -> CsmModules:
    """A checkpoint directory in the transformers layout, on CPU in float32; raises CheckpointError."""
    try:
        config = CsmConfig.from_hf(read_json(model_dir / "config.json"))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc
    modules = build_modules(config, max_positions)
    load_weights(modules, TensorPool(iter_safetensors(model_dir)), source=str(model_dir))
    return modules


def random_modules(cfg: dict[str, Any], max_positions: int, seed: int, device: torch.device | str = "cpu"
                   ) -> CsmModules:
    """Random weights of `cfg`'s shapes (`--load-format dummy`, tiny models); deterministic per seed."""
    config = CsmConfig.from_hf(cfg)
    modules = build_modules(config, max_positions, device)
    init_random(modules.backbone, seed)
    init_random(modules.depth, seed + 1)
    modules.codec = MimiDecoder.random(config.codec, seed + 2, device)
    modules.codec_encoder = MimiEncoder.random(config.codec, seed + 3, device,
                                               attention_window=config.codec.sliding_window)
    return modules


def load_weights(m: CsmModules, pool: TensorPool, source: str) -> None:
    """The file's tensors into our modules (q/k/v and gate/up fused, the heads transposed to [K-1, vocab,
    hidden]); every weight must be used and every parameter set."""
    c = m.config
    take = pool.take
    depth_embedding = take("depth_decoder.model.embed_tokens.weight")
    if TIED_AUDIO_EMBEDDING in pool.pending:
        audio_embedding = take(TIED_AUDIO_EMBEDDING)
    elif c.tie_codebooks_embeddings:
        audio_embedding = depth_embedding
    else:
        raise CheckpointError(f"checkpoint is missing {TIED_AUDIO_EMBEDDING} (tie_codebooks_embeddings is false)")
    backbone = {
        **fused_decoder_weights(take, "backbone_model.", "", c.backbone.num_layers),
        "text_embedding.weight": take("embed_text_tokens.weight"), "audio_embedding.weight": audio_embedding,
        "lm_head.weight": take("lm_head.weight"),
    }
    depth = {
        **fused_decoder_weights(take, "depth_decoder.model.", "", c.depth.num_layers),
        "in_proj.weight": take("depth_decoder.model.inputs_embeds_projector.weight"),
        "heads": take("depth_decoder.codebooks_head.weight").transpose(1, 2),
    }
    if not torch.equal(depth_embedding, audio_embedding):  # the depth decoder reads the backbone's table
        raise CheckpointError("depth_decoder.model.embed_tokens.weight differs from the backbone's audio embedding: "
                              "untied codebook embeddings are not supported")
    codec = pool.take_prefix("codec_model.")
    try:
        used = m.codec.load_checkpoint(codec, source) | m.codec_encoder.load_checkpoint(codec, source)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc
    pool.pending.update({f"codec_model.{k}": v for k, v in codec.items() if k not in used})
    pool.check_consumed()
    copy_weights(dict(m.backbone.named_parameters()), backbone)
    copy_weights(dict(m.depth.named_parameters()), depth)


def load_csm(name: str, load_format: str, device: torch.device, dtype: torch.dtype, seed: int, max_model_len: int,
             codec_path: str | None = None) -> CsmProgram:
    """The CSM program for `csm` (sesame/csm-1b), `csm-tiny` (random weights, embedded config), a local
    checkpoint directory or a cached Hugging Face id. A checkpoint brings its tokenizer.json and, optionally,
    its generation_config.json (the sampling defaults); random weights use a byte-level tokenizer."""
    if codec_path:
        raise CheckpointError("--codec-path: CSM's Mimi is part of its checkpoint (codec_model.*)")
    model_dir = None if name == "csm-tiny" else checkpoint_dir(CSM_1B_ID if name == "csm" else name, load_format)
    if model_dir is None:
        modules = random_modules(CSM_TINY_CONFIG if name == "csm-tiny" else CSM_1B_CONFIG, max_model_len, seed, device)
        tokenizer, generation = byte_level_tokenizer(specials=CSM_SPECIAL_TOKENS), {}
    else:
        modules = load_csm_dir(model_dir, max_model_len)
        tokenizer, generation = load_tokenizer_json(model_dir), _generation_config(model_dir)
    c = modules.config
    try:
        ids = PromptIds.from_tokenizer(tokenizer, bos=c.ids.bos, num_codebooks=c.num_codebooks,
                                       codebook_size=c.codec.codebook_size, codebook_eos=c.ids.codebook_eos)
    except ValueError as exc:
        raise CheckpointError(f"tokenizer.json: {exc}") from exc
    meta = csm_meta(name, ids, max_model_len, c.codec.sampling_rate, c.codec.samples_per_frame,
                    sampling_defaults(generation))
    return CsmProgram(modules.to(device, dtype), for_user_text(tokenizer), ids, meta, device, dtype)


def _generation_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "generation_config.json"
    return read_json(path) if path.exists() else {}

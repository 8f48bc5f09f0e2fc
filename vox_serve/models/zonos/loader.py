"""Loading the Zonos LM from the published layout (`config.json` + `model.safetensors`), or dummy weights.

Strict in both directions: a key the model does not have, a missing key or a wrong shape fails with the
names (upstream's `from_local` fails on extra keys and keeps its random init for missing ones; a missing
weight here is always an error). The heads are stored with 1025 rows; the logits get their padding
column(s) at -inf when guided (`sampling.guided_logits`), as the reference's load-time padding does.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vox_serve.codecs.dac.decoder import DAC_44KHZ, DacConfig, DacDecoder, load_dac
from vox_serve.models.zonos.config import ZONOS_TRANSFORMER_CONFIG, ZonosConfig
from vox_serve.models.zonos.lm import ZonosLM
from vox_serve.models.zonos.program import ZonosProgram, zonos_meta
from vox_serve.models.zonos.prompt import ZonosPrompter
from vox_serve.models.zonos.speaker import SpeakerNetwork, ZonosSpeakerModel, load_speaker_model
from vox_serve.rt.checkpoint import (
    CheckpointError,
    init_random,
    iter_safetensors,
    load_strict,
    read_json,
    resolve_local,
)


def load_zonos_lm(model_dir: Path | None, device: torch.device, dtype: torch.dtype, *, seed: int = 0,
                  config: dict[str, Any] | None = None) -> ZonosLM:
    """The LM of a checkpoint directory, or random weights of `config`'s shapes when model_dir is None."""
    if model_dir is None:
        if config is None:
            raise ValueError("dummy Zonos weights need a config")
        lm = ZonosLM(ZonosConfig.from_dict(config))
        init_random(lm, seed)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # the Fourier matrices are buffers, outside init_random's reach
            for name, buf in lm.named_buffers():
                if name.endswith(".weight"):
                    buf.copy_(torch.randn(buf.shape, generator=gen))
        return lm.to(device=device, dtype=dtype).eval()
    cfg = ZonosConfig.from_dict(config if config is not None else read_json(model_dir / "config.json"))
    lm = ZonosLM(cfg)
    load_strict(lm, dict(iter_safetensors(model_dir)), f"Zonos checkpoint {model_dir}")
    return lm.to(device=device, dtype=dtype).eval()


# zonos-tiny: the published structure at a test size (head_dim 64, so FlashInfer can serve it too)
ZONOS_TINY_CONFIG: dict[str, Any] = {
    **ZONOS_TRANSFORMER_CONFIG,
    "backbone": {**ZONOS_TRANSFORMER_CONFIG["backbone"], "d_model": 128, "n_layer": 2, "attn_mlp_d_intermediate": 256,
                 "attn_layer_idx": [0, 1],
                 "attn_cfg": {**ZONOS_TRANSFORMER_CONFIG["backbone"]["attn_cfg"], "num_heads": 2, "num_heads_kv": 1,
                              "rotary_emb_dim": 64}},
}
DAC_TINY = DacConfig(encoder_hidden_size=4, decoder_hidden_size=32)
ZONOS_ID, DAC_ID = "Zyphra/Zonos-v0.1-transformer", "descript/dac_44khz"
SPEAKER_ID = "Zyphra/Zonos-v0.1-speaker-embedding"
DUMMY_DAC_GAIN = 0.8
SPEAKER_DIM = 128  # the LDA output: the LM's speaker conditioner input
SPEAKER_TINY, SPEAKER_RELEASE = (4, (1, 1, 1, 1), 32), (64, (10, 20, 64, 3), 256)  # width, blocks, embedding


def dummy_dac(cfg: DacConfig, device: torch.device, dtype: torch.dtype, seed: int) -> DacDecoder:
    """Random DAC weights scaled by fan-in (gain 0.8: audible, unclipped output of std ~0.07 at both sizes;
    init_random's N(0, 0.02) decodes to silence), Snake alphas 1, biases 0."""
    dac = DacDecoder(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in dac.named_parameters():
            if name.endswith("alpha") or p.dim() == 1:
                p.fill_(1.0 if name.endswith("alpha") else 0.0)
                continue
            fan_in = p.shape[0] * p.shape[2] if "conv_t" in name else p[0].numel()  # ConvTranspose: [in, out, k]
            p.copy_(torch.randn(p.shape, generator=gen) * DUMMY_DAC_GAIN / math.sqrt(fan_in))
    return dac.to(device=device, dtype=dtype).eval()


def dummy_speaker(width: int, blocks: tuple[int, ...], embed_dim: int, device: torch.device,
                  seed: int) -> ZonosSpeakerModel:
    """A random speaker model (float32, as the reference runs it): uploads and saved voices work with dummy
    weights, giving a speaker vector of the LM's width that depends on the clip."""
    network = SpeakerNetwork(width, blocks, embed_dim)
    init_random(network, seed, std=0.1)
    lda = nn.Linear(embed_dim, SPEAKER_DIM)
    init_random(lda, seed + 1, std=0.1)
    return ZonosSpeakerModel(network, lda).to(device).eval()


def _find(what: str, given: str | None, default_id: str) -> Path:
    path = resolve_local(given or default_id)
    if path is None:
        raise CheckpointError(f"{what}: {given or default_id} is not a local directory or in the Hugging Face "
                              "cache; pass a path or use --load-format dummy")
    return path


def load_zonos(name: str, load_format: str, device: torch.device, dtype: torch.dtype, seed: int,
               max_model_len: int, codec_path: str | None = None) -> ZonosProgram:
    """`zonos-tiny` (random weights of ZONOS_TINY_CONFIG, a tiny DAC), `zonos` / a checkpoint dir with
    `--load-format dummy` (random weights at the published sizes, DAC 44.1 kHz), or real weights: the LM
    from the checkpoint, DAC from `--codec-path` (default descript/dac_44khz in the cache), the speaker model
    from a `speaker/` folder in the checkpoint or Zyphra/Zonos-v0.1-speaker-embedding in the cache (without
    one, requests may not upload a speaker clip)."""
    speaker = None
    if name == "zonos-tiny" or load_format == "dummy":
        tiny = name == "zonos-tiny"
        config = ZONOS_TINY_CONFIG if tiny else ZONOS_TRANSFORMER_CONFIG
        lm = load_zonos_lm(None, device, dtype, seed=seed, config=config)
        dac = dummy_dac(DAC_TINY if tiny else DAC_44KHZ, device, dtype, seed + 1)
        speaker = dummy_speaker(*(SPEAKER_TINY if tiny else SPEAKER_RELEASE), device, seed + 2)
    else:
        model_dir = _find("Zonos checkpoint", None if name == "zonos" else name, ZONOS_ID)
        lm = load_zonos_lm(model_dir, device, dtype)
        dac = load_dac(_find("DAC codec", codec_path, DAC_ID), device, dtype)
        spk = model_dir / "speaker" if (model_dir / "speaker").is_dir() else resolve_local(SPEAKER_ID)
        speaker = load_speaker_model(spk, device) if spk is not None else None
    meta = zonos_meta(name, max_model_len, lm.cfg.d_model)
    return ZonosProgram(lm, dac, ZonosPrompter(lm, speaker), meta, device, dtype)

"""Reference side of the Qwen3-TTS-Tokenizer-12Hz decoder equivalence test (run with .venv-qwen/bin/python).

usage: codec_ref.py OUT_DIR

For each tiny config below: builds the reference `Qwen3TTSTokenizerV2Model` (PyPI qwen-tts) with a fixed
seed, moves every decoder parameter away from its initial value (so that a weight we load wrongly shows),
writes it with the reference's own `save_pretrained` to OUT_DIR/<name>/ (plus a `preprocessor_config.json`,
as in the published `speech_tokenizer/` folder), decodes fixed random codes with the reference's public
`decode` and saves codes and audio to OUT_DIR/<name>/reference_audio.safetensors (for "window72" also
330 frames through both the public `decode`, which works in 300-frame chunks with 25 frames of left
context, and one unchunked `decoder` forward). OUT_DIR/manifest.json lists the configs written.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import types

import torch


def import_reference():
    """The 12 Hz tokenizer classes without `qwen_tts/__init__.py`, which pulls in the demo's audio I/O."""
    root = os.path.dirname(importlib.util.find_spec("qwen_tts").origin)
    for name, sub in (("qwen_tts", ""), ("qwen_tts.core", "core")):
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [os.path.join(root, sub)]
            sys.modules[name] = pkg
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    return Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model


# A small Mimi encoder: only present so that the checkpoint has the published shape (we never load it).
TINY_ENCODER = {
    "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
    "head_dim": 8, "intermediate_size": 32, "num_filters": 4, "codebook_size": 2048, "codebook_dim": 16,
    "num_quantizers": 16, "num_semantic_quantizers": 1, "sliding_window": 250, "upsample_groups": 16,
}
# Real geometry kept: 16 quantizers x 2048 codes, upsampling (2, 2) x (8, 5, 4, 3) = 1920 samples per frame.
# Shrunk: widths, layers; "window6" shrinks the sliding window so that 40 frames cross it many times and
# uses grouped-query attention; "window72" keeps the real window and 8 layers with an explicit head_dim.
DECODERS = {
    "window6": {
        "codebook_size": 2048, "num_quantizers": 16, "codebook_dim": 16, "latent_dim": 24, "hidden_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "num_hidden_layers": 3,
        "sliding_window": 6, "decoder_dim": 32, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
        "rope_theta": 10000, "rms_norm_eps": 1e-5,
    },
    "window72": {
        "codebook_size": 2048, "num_quantizers": 16, "codebook_dim": 8, "latent_dim": 16, "hidden_size": 16,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 12, "intermediate_size": 24,
        "num_hidden_layers": 8, "sliding_window": 72, "decoder_dim": 32, "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2], "rope_theta": 5000, "rms_norm_eps": 1e-6,
    },
}
FRAMES = {"window6": 40, "window72": 100}
LONG_FRAMES = {"window72": 330}
BATCH = 2


def perturb(decoder: torch.nn.Module) -> None:
    """Scale-preserving random weights; every norm, scale, bias and Snake parameter away from its default."""
    g = torch.Generator().manual_seed(1234)

    def rand(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g)

    with torch.no_grad():
        for name, p in decoder.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "cluster_usage":  # every 97th code unused: only the clamp at 1e-5 keeps it finite
                p.copy_(rand(p.shape, 0.5, 2.0))
                p[::97] = 0.0
            elif leaf == "embedding_sum":
                p.copy_(torch.randn(p.shape, generator=g))
                p[::97] *= 1e-5
            elif leaf == "alpha":  # SnakeBeta stores log-scales; a large 1/beta makes the stack chaotic
                p.copy_(rand(p.shape, -0.3, 0.3))
            elif leaf == "beta":
                p.copy_(rand(p.shape, 0.5, 1.0))
            elif leaf in ("scale", "gamma"):  # LayerScale / ConvNeXt gamma
                p.copy_(rand(p.shape, 0.2, 0.6))
            elif "norm" in name and leaf == "weight":
                p.copy_(rand(p.shape, 0.8, 1.2))
            elif leaf == "bias":
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:  # conv / linear weights: std 1/sqrt(fan_in), fan_in taken over everything but dim 0
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))


def scale_output(model: torch.nn.Module, codes: torch.Tensor, target_std: float = 0.25) -> None:
    """Scale the last conv so that the audio sits well inside the decoder's final clamp to [-1, 1]."""
    last = model.decoder.decoder[-1].conv
    seen = []
    hook = last.register_forward_hook(lambda mod, args, out: seen.append(out.std().item()))
    with torch.no_grad():
        model.decode(codes)
        hook.remove()
        last.weight.mul_(target_std / seen[0])
        last.bias.mul_(target_std / seen[0])


def write_one(name: str, out_dir: str, config_cls, model_cls) -> dict:
    from safetensors.torch import save_file
    from transformers import EncodecFeatureExtractor

    torch.manual_seed(0)
    config = config_cls(encoder_config=TINY_ENCODER, decoder_config=DECODERS[name])
    model = model_cls(config).eval()
    perturb(model.decoder)
    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, DECODERS[name]["codebook_size"], (BATCH, FRAMES[name], 16), generator=g)
    scale_output(model, codes)
    path = os.path.join(out_dir, name)
    model.save_pretrained(path)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000).save_pretrained(path)
    with torch.no_grad():
        wavs = model.decode(codes, return_dict=True).audio_values
    audio = torch.stack(list(wavs)).float().contiguous()
    tensors = {"codes": codes, "audio": audio}
    if name in LONG_FRAMES:  # past 300 frames the public decode restarts with 25 frames of left context
        long_codes = torch.randint(0, DECODERS[name]["codebook_size"], (1, LONG_FRAMES[name], 16), generator=g)
        with torch.no_grad():
            tensors["long_codes"] = long_codes
            tensors["long_audio_decode"] = model.decode(long_codes, return_dict=True).audio_values[0][None]
            tensors["long_audio_forward"] = model.decoder(long_codes.transpose(1, 2)).clamp(-1, 1)[:, 0]
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(path, "reference_audio.safetensors"))
    clipped = (audio.abs() >= 1).float().mean().item()
    return {"path": path, "frames": FRAMES[name], "audio_std": audio.std().item(), "clipped": clipped}


def main() -> None:
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    config_cls, model_cls = import_reference()
    manifest = {name: write_one(name, out_dir, config_cls, model_cls) for name in DECODERS}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()

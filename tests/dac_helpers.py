"""Tiny DAC checkpoints written from transformers' DacModel in each weight-norm layout (tests of the DAC codec)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import save_file

TINY = dict(encoder_hidden_size=4, decoder_hidden_size=32, downsampling_ratios=[2, 4, 8, 8], n_codebooks=9,
            codebook_size=1024, codebook_dim=8, sampling_rate=44100)
HOP = 512


def tiny_reference(seed: int = 0) -> torch.nn.Module:
    from transformers import DacConfig, DacModel

    torch.manual_seed(seed)
    model = DacModel(DacConfig(**TINY)).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial Snake alphas and biases, so a misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def save(model: torch.nn.Module, path: Path, layout: str) -> Path:
    """The checkpoint in one weight-norm layout: fused weights, parametrizations, or weight_g/weight_v
    (the model itself is left as it is)."""
    model = copy.deepcopy(model)
    path.mkdir()
    model.config.to_json_file(str(path / "config.json"))
    if layout == "parametrizations":
        model.apply_weight_norm()
    elif layout == "weight_g":
        for module in model.modules():
            if isinstance(module, torch.nn.Conv1d | torch.nn.ConvTranspose1d):
                torch.nn.utils.weight_norm(module)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    return path

"""DAC encoder: audio -> codes, for an audio prefix that a Zonos request continues.

As transformers' `DacModel.encode` (same checkpoint, the `encoder.*` and `quantizer.*` keys): a conv
front, strided blocks of residual units, then residual vector quantisation: each codebook projects the
residual to 8 dims, picks the nearest entry by cosine similarity and subtracts that entry's projection.
Zonos prepares the audio as its `DACAutoencoder.preprocess`: mono, resampled to 44.1 kHz with
torchaudio's default resampler, right-padded with zeros to a multiple of the hop.
Runs once per request at admission, eagerly.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.audio_input import resample_as_torchaudio
from vox_serve.codecs.dac.decoder import DacConfig, Quantizers, ResidualUnit, Snake
from vox_serve.codecs.weight_norm import fuse_weight_norm
from vox_serve.rt.checkpoint import iter_safetensors, load_strict, read_json


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int) -> None:
        super().__init__()
        self.res_unit1, self.res_unit2, self.res_unit3 = (ResidualUnit(dim // 2, d) for d in (1, 3, 9))
        self.snake1 = Snake(dim // 2)
        self.conv1 = nn.Conv1d(dim // 2, dim, 2 * stride, stride=stride, padding=math.ceil(stride / 2))

    def forward(self, x: Tensor) -> Tensor:
        for unit in (self.res_unit1, self.res_unit2, self.res_unit3):
            x = unit(x, None)
        return self.conv1(self.snake1(x))


class Encoder(nn.Module):
    def __init__(self, cfg: DacConfig) -> None:
        super().__init__()
        width = cfg.encoder_hidden_size
        self.conv1 = nn.Conv1d(1, width, 7, padding=3)
        self.block = nn.ModuleList(EncoderBlock(width * 2 ** (i + 1), s) for i, s in enumerate(cfg.downsampling_ratios))
        self.snake1 = Snake(cfg.hidden_size)
        self.conv2 = nn.Conv1d(cfg.hidden_size, cfg.hidden_size, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))


class DacEncoder(nn.Module):
    def __init__(self, cfg: DacConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quantizer = Quantizers(cfg)
        for q in self.quantizer.quantizers:
            q.in_proj = nn.Conv1d(cfg.hidden_size, cfg.codebook_dim, kernel_size=1)

    @torch.no_grad()
    def encode(self, audio: Tensor) -> Tensor:
        """audio [B, 1, samples] (a multiple of the hop) -> codes [B, n_codebooks, samples / hop] int64."""
        residual = self.encoder(audio)
        codes = []
        for q in self.quantizer.quantizers:
            projected = q.in_proj(residual)
            b, d, t = projected.shape
            flat = F.normalize(projected.permute(0, 2, 1).reshape(b * t, d))
            book = F.normalize(q.codebook.weight)
            # The reference's score (its argmax is the cosine nearest entry), kept verbatim for equal ties.
            score = -(flat.pow(2).sum(1, keepdim=True) - 2 * flat @ book.t()) + book.pow(2).sum(1, keepdim=True).t()
            index = score.max(1)[1].reshape(b, t)
            chosen = q.codebook(index).transpose(1, 2)
            residual = residual - q.out_proj(projected + (chosen - projected))
            codes.append(index)
        return torch.stack(codes, dim=1)

    def encode_clip(self, audio: Tensor, sample_rate: int) -> Tensor:
        """A clip [samples] or [channels, samples] at any rate -> codes [1, n_codebooks, frames]."""
        if audio.dim() == 2:
            audio = audio.mean(dim=0)
        audio = resample_as_torchaudio(audio.float(), sample_rate, self.cfg.sampling_rate)
        audio = F.pad(audio, (0, -audio.shape[-1] % self.cfg.hop_length))
        weight = self.encoder.conv1.weight
        return self.encode(audio[None, None].to(weight.device, weight.dtype))


def load_dac_encoder(model_dir: Path, device: torch.device, dtype: torch.dtype) -> DacEncoder:
    """The encoder and quantizer of a DacModel checkpoint directory (decoder weights are dropped)."""
    model = DacEncoder(DacConfig.from_dict(read_json(model_dir / "config.json")))
    tensors = fuse_weight_norm(dict(iter_safetensors(model_dir)))
    kept = {k: v for k, v in tensors.items() if not k.startswith("decoder.")}
    load_strict(model, kept, f"DAC checkpoint {model_dir}")
    return model.to(device=device, dtype=dtype).eval()

"""DAC decoder (Descript Audio Codec; Zonos uses descript/dac_44khz): codes -> 44.1 kHz PCM, our own implementation.

Loads transformers' `DacModel` layout (`config.json` + `model.safetensors`: `quantizer.quantizers.{i}.codebook`
/ `.out_proj`, `decoder.conv1`, `decoder.block.{i}.{snake1,conv_t1,res_unit1..3}`, `decoder.snake1`,
`decoder.conv2`), keeps the decoder side and folds weight norm in every layout (`weight_g`/`weight_v`,
`parametrizations.weight.original0/1`, fused `weight`). T frames decode to exactly T * hop samples.

DAC is not causal: every convolution is centred. For windowed decoding `decode` takes a valid frame range
per row and zeroes the activations outside it before every time-mixing convolution, which is exactly the
zero padding a one-shot decode of those frames sees at its ends. So a window that reaches the sequence
start or end is exact there, and one that extends `receptive_field` frames past the kept ones is exact
(to float rounding) everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vox_serve.codecs.weight_norm import fuse_weight_norm
from vox_serve.rt.checkpoint import iter_safetensors, load_strict, read_json
from vox_serve.rt.derived import Derived

RESIDUAL_DILATIONS = (1, 3, 9)
RESIDUAL_KERNEL = 7
EDGE_KERNEL = 7  # decoder.conv1 and decoder.conv2


@dataclass(frozen=True)
class DacConfig:
    encoder_hidden_size: int = 64
    downsampling_ratios: tuple[int, ...] = (2, 4, 8, 8)
    decoder_hidden_size: int = 1536
    n_codebooks: int = 9
    codebook_size: int = 1024
    codebook_dim: int = 8
    sampling_rate: int = 44100

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DacConfig:
        known = {f: d[f] for f in cls.__dataclass_fields__ if f in d}
        if "downsampling_ratios" in known:
            known["downsampling_ratios"] = tuple(int(r) for r in known["downsampling_ratios"])
        return cls(**known)

    @property
    def hidden_size(self) -> int:
        return self.encoder_hidden_size * 2 ** len(self.downsampling_ratios)

    @property
    def upsampling_ratios(self) -> tuple[int, ...]:
        return self.downsampling_ratios[::-1]

    @property
    def hop_length(self) -> int:
        return math.prod(self.downsampling_ratios)


DAC_44KHZ = DacConfig()


class Snake(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))
        self._scale = Derived(lambda a: ((a + 1e-9).reciprocal(),))

    def forward(self, x: Tensor) -> Tensor:
        (scale,) = self._scale.get(self.alpha)
        return x + scale * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.snake1 = Snake(channels)
        self.conv1 = nn.Conv1d(channels, channels, RESIDUAL_KERNEL, dilation=dilation,
                               padding=(RESIDUAL_KERNEL - 1) * dilation // 2)
        self.snake2 = Snake(channels)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=1)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        return x + self.conv2(self.snake2(self.conv1(_masked(self.snake1(x), mask))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.snake1 = Snake(cin)
        self.conv_t1 = nn.ConvTranspose1d(cin, cout, 2 * stride, stride=stride, padding=math.ceil(stride / 2))
        self.res_unit1, self.res_unit2, self.res_unit3 = (ResidualUnit(cout, d) for d in RESIDUAL_DILATIONS)

    def forward(self, x: Tensor, masks: tuple[Tensor | None, Tensor | None]) -> Tensor:
        x = self.conv_t1(_masked(self.snake1(x), masks[0]))
        for unit in (self.res_unit1, self.res_unit2, self.res_unit3):
            x = unit(x, masks[1])
        return x


class Decoder(nn.Module):
    def __init__(self, cfg: DacConfig) -> None:
        super().__init__()
        ch = cfg.decoder_hidden_size
        self.conv1 = nn.Conv1d(cfg.hidden_size, ch, EDGE_KERNEL, padding=EDGE_KERNEL // 2)
        self.block = nn.ModuleList(DecoderBlock(ch // 2**i, ch // 2 ** (i + 1), s)
                                   for i, s in enumerate(cfg.upsampling_ratios))
        out_ch = ch // 2 ** len(cfg.upsampling_ratios)
        self.snake1 = Snake(out_ch)
        self.conv2 = nn.Conv1d(out_ch, 1, EDGE_KERNEL, padding=EDGE_KERNEL // 2)


class Quantizer(nn.Module):
    """The decoder half of one residual codebook: lookup, then a 1x1 projection to the latent width."""

    def __init__(self, cfg: DacConfig) -> None:
        super().__init__()
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)
        self.out_proj = nn.Conv1d(cfg.codebook_dim, cfg.hidden_size, kernel_size=1)


class Quantizers(nn.Module):
    def __init__(self, cfg: DacConfig) -> None:
        super().__init__()
        self.quantizers = nn.ModuleList(Quantizer(cfg) for _ in range(cfg.n_codebooks))


def _masked(x: Tensor, mask: Tensor | None) -> Tensor:
    return x if mask is None else x * mask


def _frame_mask(valid: Tensor, frames: int, rate: int, dtype: torch.dtype) -> Tensor:
    """valid [B, 2] (first, end) frames -> [B, 1, frames * rate]: 1 on the samples of valid frames."""
    pos = torch.arange(frames * rate, device=valid.device)
    keep = (pos >= valid[:, :1] * rate) & (pos < valid[:, 1:] * rate)
    return keep[:, None].to(dtype)


class DacDecoder(nn.Module):
    def __init__(self, cfg: DacConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.quantizer = Quantizers(cfg)
        self.decoder = Decoder(cfg)

    def latents(self, codes: Tensor) -> Tensor:
        """codes [B, n_codebooks, T] -> [B, hidden, T]: the sum of the projected codebook vectors."""
        z = None
        for i, q in enumerate(self.quantizer.quantizers):
            part = q.out_proj(q.codebook(codes[:, i]).transpose(1, 2))
            z = part if z is None else z + part
        return z

    def decode(self, codes: Tensor, valid: Tensor | None = None) -> Tensor:
        """codes [B, n_codebooks, T] int64 (0..codebook_size-1) -> audio [B, T * hop] in [-1, 1], model dtype.

        valid [B, 2] int64 (first, end) frames of each row that exist; the rest of the window is padding
        (its codes are ignored). None: all T frames. Fixed shapes, no host syncs: capturable.
        """
        frames = codes.shape[-1]
        dec = self.decoder
        x = self.latents(codes)
        dtype = x.dtype
        rate, rates = 1, [1]
        for s in self.cfg.upsampling_ratios:
            rate *= s
            rates.append(rate)

        def mask(r: int) -> Tensor | None:
            return None if valid is None else _frame_mask(valid, frames, r, dtype)

        x = dec.conv1(_masked(x, mask(1)))
        for i, block in enumerate(dec.block):
            x = block(x, (mask(rates[i]), mask(rates[i + 1])))
        x = dec.conv2(_masked(dec.snake1(x), mask(rates[-1])))
        return torch.tanh(x)[:, 0]


def receptive_field(cfg: DacConfig) -> tuple[int, int]:
    """(frames before, frames after) a frame whose codes can change its samples: a window this much wider
    than the kept frames on each side decodes them exactly. Walks every sample offset of a frame back
    through the layers to the frame range it reads."""
    res_span = sum((RESIDUAL_KERNEL - 1) * d // 2 for d in RESIDUAL_DILATIONS)
    before = after = 0
    for offset in range(cfg.hop_length):
        lo, hi = offset - EDGE_KERNEL // 2, offset + EDGE_KERNEL // 2  # decoder.conv2, in output samples
        for stride in reversed(cfg.upsampling_ratios):
            lo, hi = lo - res_span, hi + res_span
            pad = math.ceil(stride / 2)  # conv_t1: output p reads inputs j with 0 <= p + pad - j * stride < 2 * stride
            lo, hi = -(-(lo + pad - 2 * stride + 1) // stride), (hi + pad) // stride
        before = max(before, EDGE_KERNEL // 2 - lo)  # decoder.conv1, in frames
        after = max(after, hi + EDGE_KERNEL // 2)
    return before, after


def load_dac(model_dir: Path, device: torch.device, dtype: torch.dtype) -> DacDecoder:
    """The decoder of a DacModel checkpoint directory (encoder weights are read and dropped)."""
    cfg = DacConfig.from_dict(read_json(model_dir / "config.json"))
    model = DacDecoder(cfg)
    tensors = fuse_weight_norm(dict(iter_safetensors(model_dir)))
    kept = {k: v for k, v in tensors.items() if not k.startswith("encoder.") and ".in_proj." not in k}
    load_strict(model, kept, f"DAC checkpoint {model_dir}")
    return model.to(device=device, dtype=dtype).eval()

"""The Qwen3-TTS Base model's speaker encoder: 24 kHz audio -> log-mel spectrogram -> ECAPA-TDNN -> x-vector.

The x-vector (`enc_dim` wide, the talker's hidden size) is added to the talker input at the prompt's
speaker position. The front end is fixed by the reference (`extract_speaker_embedding`): 128 Slaney mel
bands up to 12 kHz over a 1024-point STFT (Hann window, hop 256) of the reflect-padded signal, magnitude
with a 1e-9 floor, natural log clamped at 1e-5. The network is ECAPA-TDNN (Desplanques et al. 2020): a TDNN,
SE-Res2Net blocks, multi-layer feature aggregation, attentive statistics pooling, a final 1x1 conv. Every
convolution pads "same" by reflection, as the reference's do. Weight names follow the checkpoint's
`speaker_encoder.*` keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SAMPLE_RATE, N_FFT, HOP, NUM_MELS, F_MAX = 24000, 1024, 256, 128, 12000.0
STATS_EPS = 1e-12  # the variance floor of the attentive pooling


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    mel_dim: int = NUM_MELS
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeakerEncoderConfig:
        if d.get("sample_rate", SAMPLE_RATE) != SAMPLE_RATE or d.get("mel_dim", NUM_MELS) != NUM_MELS:
            raise ValueError("speaker_encoder_config: only 24 kHz audio and 128 mel bands are supported")
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in cls.__dataclass_fields__}
        cfg = cls(**kw)
        if not len(cfg.enc_channels) == len(cfg.enc_kernel_sizes) == len(cfg.enc_dilations):
            raise ValueError("speaker_encoder_config: enc_channels, enc_kernel_sizes, enc_dilations differ in length")
        return cfg


def _hz_to_mel(hz: Tensor) -> Tensor:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    return torch.where(hz >= min_log_hz, min_log_hz / f_sp + torch.log(hz / min_log_hz) / logstep, hz / f_sp)


def _mel_to_hz(mel: Tensor) -> Tensor:
    f_sp, min_log_hz, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp
    return torch.where(mel >= min_log_mel, min_log_hz * torch.exp(logstep * (mel - min_log_mel)), f_sp * mel)


def mel_filterbank(sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT, num_mels: int = NUM_MELS,
                   f_min: float = 0.0, f_max: float = F_MAX) -> Tensor:
    """[num_mels, n_fft // 2 + 1] float32 triangular filters, Slaney-normalised (equal area), built in float64."""
    fft_hz = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    lo, hi = _hz_to_mel(torch.tensor([f_min, f_max], dtype=torch.float64))
    edges = _mel_to_hz(torch.linspace(float(lo), float(hi), num_mels + 2, dtype=torch.float64))
    widths = edges.diff()
    ramps = edges[:, None] - fft_hz[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = torch.clamp(torch.minimum(rising, falling), min=0.0)
    return (weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]).float()


def log_mel(audio: Tensor, filterbank: Tensor) -> Tensor:
    """audio [B, samples] float32 in [-1, 1] -> [B, frames, num_mels]."""
    pad = (N_FFT - HOP) // 2
    x = F.pad(audio.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    window = torch.hann_window(N_FFT, device=audio.device)
    spec = torch.stft(x, N_FFT, hop_length=HOP, win_length=N_FFT, window=window, center=False, return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(filterbank @ magnitude, min=1e-5)).transpose(1, 2)


class ReflectConv(nn.Module):
    """Conv1d with "same" reflection padding (what the reference's padding_mode="reflect" does)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation)
        total = dilation * (kernel - 1)
        self.pad = (total // 2, total - total // 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, self.pad, mode="reflect") if self.pad != (0, 0) else x)


class Tdnn(ReflectConv):
    """A time-delay layer: conv then ReLU."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(super().forward(x))


class Res2Net(nn.Module):
    """Channels split into `scale` groups; group i > 0 is a TDNN over itself plus group i-1's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(Tdnn(channels // scale, channels // scale, kernel, dilation)
                                    for _ in range(scale - 1))

    def forward(self, x: Tensor) -> Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out = [parts[0]]
        for i, block in enumerate(self.blocks, start=1):
            out.append(block(parts[i] if i == 1 else parts[i] + out[-1]))
        return torch.cat(out, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, bottleneck: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(channels, bottleneck, 1)
        self.conv2 = nn.Conv1d(bottleneck, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SeRes2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = Tdnn(channels, channels, 1)
        self.res2net_block = Res2Net(channels, scale, kernel, dilation)
        self.tdnn2 = Tdnn(channels, channels, 1)
        self.se_block = SqueezeExcite(channels, se_channels)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _weighted_stats(x: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation over time of x [B, C, T] under weights summing to 1 over T."""
    mean = (weights * x).sum(dim=2)
    var = (weights * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2)
    return mean, torch.sqrt(var.clamp(min=STATS_EPS))


class AttentiveStatsPool(nn.Module):
    """Attention over time conditioned on the utterance's global mean and std; returns [B, 2C]."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = Tdnn(channels * 3, attention_channels, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        frames = x.shape[2]
        mean, std = _weighted_stats(x, torch.full_like(x[:, :1], 1.0 / frames))
        context = torch.cat([x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        return torch.cat(_weighted_stats(x, attention), dim=1)


class SpeakerEncoder(nn.Module):
    """24 kHz audio -> one speaker embedding [enc_dim]."""

    def __init__(self, config: SpeakerEncoderConfig) -> None:
        super().__init__()
        c = config
        ch, ks, dil = c.enc_channels, c.enc_kernel_sizes, c.enc_dilations
        self.blocks = nn.ModuleList([Tdnn(c.mel_dim, ch[0], ks[0], dil[0])] + [
            SeRes2NetBlock(ch[i], c.enc_res2net_scale, c.enc_se_channels, ks[i], dil[i])
            for i in range(1, len(ch) - 1)])
        if any(ch[i] != ch[i - 1] for i in range(1, len(ch) - 1)):
            raise ValueError("speaker_encoder_config: the SE-Res2Net blocks must keep their width (residuals)")
        self.mfa = Tdnn(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], c.enc_attention_channels)
        self.fc = nn.Conv1d(ch[-1] * 2, c.enc_dim, 1)
        self.register_buffer("filterbank", mel_filterbank(), persistent=False)

    @torch.no_grad()
    def forward(self, audio: Tensor) -> Tensor:
        """audio [samples] float32 at 24 kHz -> [enc_dim] float32."""
        w = self.fc.weight
        x = log_mel(audio.to(w.device, torch.float32)[None], self.filterbank).transpose(1, 2).to(w.dtype)
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.mfa(torch.cat(outputs[1:], dim=1))  # every block's output but the first TDNN's
        return self.fc(self.asp(x).unsqueeze(2))[0, :, 0].float()

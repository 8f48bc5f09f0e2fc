"""The Zonos speaker model (`Zyphra/Zonos-v0.1-speaker-embedding`): a reference clip -> the 128-d speaker input.

Audio (any rate, channels averaged) -> 16 kHz (torchaudio's default sinc resampler, as the reference) ->
80-bin HTK log-mel (FFT 512, window 400, hop 160, log(x + 1e-6), mean over time removed) -> ResNet with
SimAM basic blocks ([10, 20, 64, 3] blocks at width 64 in the release) -> attentive statistics pooling ->
256-d embedding -> LDA (Linear 256 -> 128) -> rounded to bfloat16, as `make_speaker_embedding` returns it.

The release is two `torch.save`d state dicts: `ResNet293_SimAM_ASP_base.pt` (the network) and
`ResNet293_SimAM_ASP_base_LDA-128.pt` (the LDA). Block counts, width and embedding size are read from
the keys and shapes, and loading is strict. Runs once per request with reference audio, off the step path.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.audio_input import resample_as_torchaudio
from vox_serve.rt.checkpoint import CheckpointError, load_strict

SAMPLE_RATE = 16000
N_FFT, WIN_LENGTH, HOP_LENGTH, NUM_MELS = 512, 400, 160, 80
SIMAM_LAMBDA = 1e-4
ATTENTION_CHANNELS = 128
NETWORK_FILE = "ResNet293_SimAM_ASP_base.pt"
LDA_FILE = "ResNet293_SimAM_ASP_base_LDA-128.pt"


def htk_mel_filterbank() -> Tensor:
    """[n_fft // 2 + 1, 80] triangular filters on the HTK mel scale, unnormalised, 0 .. 8 kHz (float32,
    computed as torchaudio's `melscale_fbanks` does)."""
    freqs = torch.linspace(0, SAMPLE_RATE // 2, N_FFT // 2 + 1)
    top = 2595.0 * math.log10(1.0 + (SAMPLE_RATE / 2) / 700.0)
    edges = 700.0 * (10 ** (torch.linspace(0.0, top, NUM_MELS + 2) / 2595.0) - 1.0)
    widths = edges[1:] - edges[:-1]
    slopes = edges[None, :] - freqs[:, None]
    rising, falling = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    return torch.clamp(torch.minimum(rising, falling), min=0.0)


def log_mel(audio: Tensor, filterbank: Tensor) -> Tensor:
    """audio [B, samples] at 16 kHz -> [B, 80, frames]: log power mel, each band's mean over time removed."""
    window = torch.hann_window(WIN_LENGTH, device=audio.device, dtype=audio.dtype)
    spec = torch.stft(audio, N_FFT, HOP_LENGTH, WIN_LENGTH, window, center=True, pad_mode="reflect",
                      return_complex=True).abs().pow(2)
    mel = (spec.transpose(1, 2) @ filterbank).transpose(1, 2)
    logs = torch.log(mel + 1e-6)
    return logs - logs.mean(dim=2, keepdim=True)


def simam(x: Tensor) -> Tensor:
    """Parameter-free attention: each activation weighted by sigmoid of its energy against its channel map."""
    n = x.shape[2] * x.shape[3] - 1
    d = (x - x.mean(dim=(2, 3), keepdim=True)).pow(2)
    v = d.sum(dim=(2, 3), keepdim=True) / n
    return x * torch.sigmoid(d / (4 * (v + SIMAM_LAMBDA)) + 0.5)


class SimAMBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential()
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(simam(out) + self.downsample(x))


class ResNet(nn.Module):
    def __init__(self, width: int, blocks: tuple[int, ...]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        cin = width
        for i, count in enumerate(blocks):
            cout, stride = width * 2**i, 1 if i == 0 else 2
            layer = nn.Sequential(*(SimAMBlock(cin if j == 0 else cout, cout, stride if j == 0 else 1)
                                    for j in range(count)))
            self.add_module(f"layer{i + 1}", layer)
            cin = cout
        self.num_layers = len(blocks)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        for i in range(self.num_layers):
            x = getattr(self, f"layer{i + 1}")(x)
        return x


class AttentiveStatsPooling(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.attention = nn.Sequential(nn.Conv1d(features, ATTENTION_CHANNELS, 1), nn.ReLU(),
                                       nn.BatchNorm1d(ATTENTION_CHANNELS), nn.Conv1d(ATTENTION_CHANNELS, features, 1),
                                       nn.Softmax(dim=2))

    def forward(self, x: Tensor) -> Tensor:
        """[B, C, F, T] -> [B, 2 * C * F]: attention-weighted mean and standard deviation over time."""
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        w = self.attention(x)
        mu = (x * w).sum(dim=2)
        sd = torch.sqrt((((x**2) * w).sum(dim=2) - mu**2).clamp(min=1e-5))
        return torch.cat([mu, sd], dim=1)


class SpeakerNetwork(nn.Module):
    """Keys as released: `front.*` (the ResNet), `pooling.attention.*`, `bottleneck.*`."""

    def __init__(self, width: int, blocks: tuple[int, ...], embed_dim: int) -> None:
        super().__init__()
        self.front = ResNet(width, blocks)
        features = width * 2 ** (len(blocks) - 1) * (NUM_MELS // 8)
        self.pooling = AttentiveStatsPooling(features)
        self.bottleneck = nn.Linear(2 * features, embed_dim)

    def forward(self, feats: Tensor) -> Tensor:
        return self.bottleneck(self.pooling(self.front(feats[:, None])))


class ZonosSpeakerModel(nn.Module):
    def __init__(self, network: SpeakerNetwork, lda: nn.Linear) -> None:
        super().__init__()
        self.network, self.lda = network, lda
        self.register_buffer("filterbank", htk_mel_filterbank(), persistent=False)

    @torch.no_grad()
    def embed(self, audio: Tensor, sample_rate: int) -> tuple[Tensor, Tensor]:
        """audio [samples] or [channels, samples] float -> (256-d embedding, 128-d LDA output), float32."""
        if audio.dim() == 2:
            audio = audio.mean(dim=0)
        audio = resample_as_torchaudio(audio.float(), sample_rate, SAMPLE_RATE)
        dtype = self.filterbank.dtype
        feats = log_mel(audio[None].to(self.filterbank.device, dtype), self.filterbank)
        emb = self.network(feats).float()
        return emb[0], self.lda(emb)[0]

    def speaker_vector(self, audio: Tensor, sample_rate: int) -> Tensor:
        """The conditioning input the reference makes from a clip: the LDA output rounded to bfloat16 [128]."""
        return self.embed(audio, sample_rate)[1].bfloat16().float()


def _block_counts(keys: list[str]) -> tuple[int, ...]:
    counts: dict[int, int] = {}
    for key in keys:
        m = re.match(r"front\.layer(\d+)\.(\d+)\.", key)
        if m:
            layer, block = int(m.group(1)), int(m.group(2))
            counts[layer] = max(counts.get(layer, 0), block + 1)
    if sorted(counts) != list(range(1, len(counts) + 1)) or not counts:
        raise CheckpointError(f"speaker network keys have no front.layer1..N blocks (found layers {sorted(counts)})")
    return tuple(counts[i] for i in sorted(counts))


def load_speaker_model(directory: Path, device: torch.device) -> ZonosSpeakerModel:
    """The two released files in `directory`, strictly; runs in float32 like the reference."""
    try:
        sd = torch.load(directory / NETWORK_FILE, map_location="cpu", weights_only=True)
        lda_sd = torch.load(directory / LDA_FILE, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise CheckpointError(f"speaker model file missing: {exc.filename}") from exc
    try:
        width, embed_dim = sd["front.conv1.weight"].shape[0], sd["bottleneck.weight"].shape[0]
        lda = nn.Linear(lda_sd["weight"].shape[1], lda_sd["weight"].shape[0])
    except KeyError as exc:
        raise CheckpointError(f"speaker model is missing {exc}") from exc
    network = SpeakerNetwork(width, _block_counts(list(sd)), embed_dim)
    load_strict(network, sd, f"speaker network {directory / NETWORK_FILE}")
    load_strict(lda, lda_sd, f"speaker LDA {directory / LDA_FILE}")
    return ZonosSpeakerModel(network, lda).to(device).eval()

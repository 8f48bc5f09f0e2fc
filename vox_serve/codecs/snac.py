"""SNAC decoder (hubertsiuzdak/snac): codebook lookups + upsampling conv decoder, our own implementation.

Loads the published checkpoint layout (``config.json`` + ``pytorch_model.bin`` or ``model.safetensors``),
keeps only the decoder-side weights and fuses weight norm at load time. The reference ``NoiseBlock`` adds
``torch.randn`` noise; ours draws it from a counter-based hash of (seed, absolute sample index, layer), so
the output is deterministic, batch-independent and identical across overlapping streaming windows.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.codecs.weight_norm import fuse_weight_norm
from vox_serve.rt import codec_kernels, implicit_gemm, triton_ops
from vox_serve.rt.derived import Derived
from vox_serve.rt.kernels import hash_normal


def _hash_normal(seed: Tensor, start: Tensor, n: int) -> Tensor:
    """Standard normals addressed by absolute position: out[i, j] = N(seed[i], position start[i] + j).

    seed, start: int64 [N]; returns float32 [N, n]. Built on the shared counter-based
    ``hash_normal(seed, offset, n)`` (whose ``offset`` is a stream key, not a position) by using each
    position as its own key with n=1. Pure tensor ops, no host sync (CUDA-graph friendly).
    """
    pos = start.to(torch.int64)[:, None] + torch.arange(n, device=start.device, dtype=torch.int64)
    keys = seed.to(torch.int64)[:, None].expand(-1, n).reshape(-1)
    return hash_normal(keys, pos.reshape(-1), 1).reshape(-1, n)


@dataclass(frozen=True)
class SnacConfig:
    sampling_rate: int = 24000
    encoder_dim: int = 48
    encoder_rates: tuple[int, ...] = (2, 4, 8, 8)
    decoder_dim: int = 1024
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)
    attn_window_size: int | None = None
    codebook_size: int = 4096
    codebook_dim: int = 8
    vq_strides: tuple[int, ...] = (4, 2, 1)
    noise: bool = True
    depthwise: bool = True
    latent_dim: int | None = None

    def __post_init__(self) -> None:
        for k in ("encoder_rates", "decoder_rates", "vq_strides"):
            object.__setattr__(self, k, tuple(int(v) for v in getattr(self, k)))
        if self.latent_dim is None:
            object.__setattr__(self, "latent_dim", self.encoder_dim * 2 ** len(self.encoder_rates))

    @classmethod
    def from_dict(cls, d: dict) -> SnacConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def hop_length(self) -> int:
        return math.prod(self.encoder_rates)

    @property
    def codes_per_level(self) -> tuple[int, ...]:
        return tuple(max(self.vq_strides) // s for s in self.vq_strides)

    @property
    def codes_per_frame(self) -> int:
        return sum(self.codes_per_level)

    @property
    def samples_per_frame(self) -> int:
        return self.hop_length * max(self.vq_strides)


def orpheus_frames_to_codes(frames: Tensor) -> list[Tensor]:
    """Orpheus frame codes [B, F, 7] -> SNAC levels [B, F], [B, 2F], [B, 4F].

    Per frame: level0 = [s0], level1 = [s1, s4], level2 = [s2, s3, s5, s6].
    """
    b, f, _ = frames.shape
    lvl1 = torch.stack([frames[:, :, j] for j in (1, 4)], dim=-1).reshape(b, 2 * f)
    lvl2 = torch.stack([frames[:, :, j] for j in (2, 3, 5, 6)], dim=-1).reshape(b, 4 * f)
    return [frames[:, :, 0], lvl1, lvl2]


class _Snake(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, dim, 1))
        self._scale = Derived(lambda a: ((a + 1e-9).reciprocal(),))

    def factors(self) -> tuple[Tensor, Tensor]:
        """(alpha, 1 / alpha): what a kernel that applies this Snake in its epilogue takes."""
        return self.alpha, self._scale.get(self.alpha)[0]

    def forward(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """`bias` (GPUs): a convolution's bias, added to x first in the same kernel."""
        alpha, scale = self.factors()
        if triton_ops.enabled(x):
            return codec_kernels.snake(x, alpha, scale, bias=bias)
        x = x if bias is None else x + bias[:, None]
        return x + scale * torch.sin(alpha * x).pow(2)


def _conv_reach(conv: nn.Conv1d) -> tuple[int, int]:
    """How many input columns left and right of an output column a stride-1 convolution reads."""
    left = conv.padding[0]
    return left, conv.dilation[0] * (conv.kernel_size[0] - 1) - left


class _ResUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int):
        super().__init__()
        self.block = nn.Sequential(
            _Snake(dim), nn.Conv1d(dim, dim, 7, dilation=dilation, padding=3 * dilation, groups=groups),
            _Snake(dim), nn.Conv1d(dim, dim, 1))

    def forward(self, x: Tensor) -> Tensor:
        snake, conv, snake2, proj = self.block
        if not triton_ops.enabled(x):
            return x + proj(snake2(codec_kernels.conv1d(conv, snake(x))))
        if codec_kernels.fuses(conv, proj):  # GPUs: Snake; the convolution + Snake; the 1x1 + residual add
            h = codec_kernels.depthwise_conv1d(snake(x), conv.weight, conv.bias, conv.dilation[0], conv.padding[0],
                                               snake=snake2.factors())
            return implicit_gemm.pointwise_conv1d(h, proj.weight, proj.bias, residual=x)
        # on GPUs each convolution's bias rides in the kernel after it (Snake, the residual add)
        h = snake2(codec_kernels.conv1d(conv, snake(x), bias=False), bias=conv.bias)
        return codec_kernels.add_residual(x, codec_kernels.conv1d(proj, h, bias=False), proj.bias)


class _Noise(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Conv1d(dim, dim, 1, bias=False)

    def forward(self, x: Tensor, noise: Tensor | None) -> Tensor:
        """noise: float32 [B, 1, T] or None (no noise)."""
        if noise is None:
            return x
        if triton_ops.enabled(x) and codec_kernels.fuses(None, self.linear):
            return implicit_gemm.pointwise_conv1d(x, self.linear.weight, None, residual=x, noise=noise)
        return x + noise.to(x.dtype) * self.linear(x)


class _DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, noise: bool, groups: int):
        super().__init__()
        up = nn.ConvTranspose1d(cin, cout, 2 * stride, stride=stride, padding=math.ceil(stride / 2),
                                output_padding=stride % 2)
        layers = [_Snake(cin), up] + ([_Noise(cout)] if noise else [])
        self.block = nn.Sequential(*layers, *(_ResUnit(cout, d, groups) for d in (1, 3, 9)))

    @property
    def stride(self) -> int:
        return self.block[1].stride[0]

    def output_length(self, length: int) -> int:
        """Output columns of the block for `length` input columns."""
        up = self.block[1]
        k, s, p, op = up.kernel_size[0], up.stride[0], up.padding[0], up.output_padding[0]
        return (length - 1) * s - 2 * p + k + op

    def unit_reach(self) -> tuple[int, int]:
        """Output columns left and right of a column that its residual units read."""
        reaches = [_conv_reach(m) for unit in self.block if isinstance(unit, _ResUnit) for m in unit.block
                   if isinstance(m, nn.Conv1d)]
        return sum(r[0] for r in reaches), sum(r[1] for r in reaches)

    def input_span(self, lo: int, hi: int, length: int) -> tuple[int, int]:
        """The input columns [a, b) (of `length`) that the transposed convolution's outputs [lo, hi) read:
        output t adds input i where 0 <= t + padding - i * stride < kernel."""
        up = self.block[1]
        k, s, p = up.kernel_size[0], up.stride[0], up.padding[0]
        return max((lo + p - k) // s + 1, 0), min((hi - 1 + p) // s + 1, length)

    def forward(self, x: Tensor, noise: Tensor | None) -> Tensor:
        for m in self.block:
            if isinstance(m, _Noise):
                x = m(x, noise)
            else:
                x = codec_kernels.conv_transpose1d(m, x) if isinstance(m, nn.ConvTranspose1d) else m(x)
        return x


class _LocalMHA(nn.Module):
    """Windowed self-attention with rotary embeddings (non-xpos), as in the reference decoder."""

    def __init__(self, dim: int, window: int, dim_head: int = 64):
        super().__init__()
        self.norm, self.window, self.heads = nn.LayerNorm(dim), window, dim // dim_head
        self.to_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.to_out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # x: [B, C, T], T a multiple of the window
        b, c, t = x.shape
        w, h, d = self.window, self.heads, c // self.heads
        q, k, v = self.to_qkv(self.norm(x.transpose(1, 2))).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t // w, w, h, d).permute(0, 3, 1, 2, 4) for z in (q, k, v))
        inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
        freqs = torch.arange(w, device=x.device, dtype=torch.float32)[:, None] * inv_freq
        freqs = torch.cat((freqs, freqs), dim=-1)
        cos, sin = freqs.cos().to(q.dtype), freqs.sin().to(q.dtype)

        def rot(z: Tensor) -> Tensor:
            z1, z2 = z.chunk(2, dim=-1)
            return z * cos + torch.cat((-z2, z1), dim=-1) * sin

        out = F.scaled_dot_product_attention(rot(q), rot(k), v)
        out = self.to_out(out.permute(0, 2, 3, 1, 4).reshape(b, t, c))
        return out.transpose(1, 2) + x


class _VQ(nn.Module):
    def __init__(self, cfg: SnacConfig, stride: int):
        super().__init__()
        self.stride = stride
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)
        self.out_proj = nn.Conv1d(cfg.codebook_dim, cfg.latent_dim, 1)

    def forward(self, codes: Tensor) -> Tensor:  # [B, T_l] -> [B, latent, T_l * stride]
        z = self.out_proj(self.codebook(codes).transpose(1, 2))
        b, c, t = z.shape
        return z[..., None].expand(b, c, t, self.stride).reshape(b, c, t * self.stride)




class SnacDecoder(nn.Module):
    """SNAC codes -> waveform. ``decode(codes)`` with codes[l]: [B, F * codes_per_level[l]] int64."""

    def __init__(self, config: SnacConfig):
        super().__init__()
        self.config = cfg = config
        self.quantizer = nn.Module()
        self.quantizer.quantizers = nn.ModuleList(_VQ(cfg, s) for s in cfg.vq_strides)
        lat, ch = cfg.latent_dim, cfg.decoder_dim
        if cfg.depthwise:
            layers = [nn.Conv1d(lat, lat, 7, padding=3, groups=lat), nn.Conv1d(lat, ch, 1)]
        else:
            layers = [nn.Conv1d(lat, ch, 7, padding=3)]
        if cfg.attn_window_size is not None:
            layers.append(_LocalMHA(ch, cfg.attn_window_size))
        for i, stride in enumerate(cfg.decoder_rates):
            cin, cout = ch // 2**i, ch // 2 ** (i + 1)
            layers.append(_DecoderBlock(cin, cout, stride, cfg.noise, cout if cfg.depthwise else 1))
        layers += [_Snake(cout), nn.Conv1d(cout, 1, 7, padding=3), nn.Tanh()]
        self.decoder = nn.Module()
        self.decoder.model = nn.Sequential(*layers)

    @classmethod
    def from_dir(cls, path: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
                 ) -> SnacDecoder:
        """Load ``config.json`` + ``pytorch_model.bin`` (or ``model.safetensors``) from ``path``."""
        with open(os.path.join(path, "config.json")) as f:
            model = cls(SnacConfig.from_dict(json.load(f)))
        st = os.path.join(path, "model.safetensors")
        if os.path.exists(st):
            from safetensors.torch import load_file
            sd = load_file(st)
        else:
            sd = torch.load(os.path.join(path, "pytorch_model.bin"), map_location="cpu", weights_only=True)
        model.load_decoder_state_dict(sd, source=path)
        return model.to(device=device, dtype=dtype).eval()

    @classmethod
    def random(cls, config: SnacConfig, seed: int = 0, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> SnacDecoder:
        """Random weights of the checkpoint's shapes (for ``--load-format dummy``)."""
        g = torch.Generator().manual_seed(seed)
        model = cls(config)
        with torch.no_grad():  # torch-default-like scales: std 1/sqrt(3 * fan_in), fan_in = weight[0].numel()
            for m in model.modules():
                if isinstance(m, nn.Conv1d | nn.ConvTranspose1d | nn.Linear):
                    std = 1.0 / math.sqrt(3 * m.weight[0].numel())
                    m.weight.copy_(std * torch.randn(m.weight.shape, generator=g))
                elif isinstance(m, nn.Embedding):
                    m.weight.copy_(torch.randn(m.weight.shape, generator=g))
                elif isinstance(m, _Snake):
                    m.alpha.copy_(0.5 + torch.rand(m.alpha.shape, generator=g))
                if isinstance(m, nn.Conv1d | nn.ConvTranspose1d) and m.bias is not None:
                    m.bias.zero_()
        return model.to(device=device, dtype=dtype).eval()

    def load_decoder_state_dict(self, sd: dict[str, Tensor], source: str = "state dict") -> None:
        """Load decoder-side weights from a reference SNAC state dict (any weight-norm layout)."""
        sd = {k: v for k, v in sd.items() if not (k.startswith("encoder.") or ".in_proj." in k
                                                  or k.endswith("rel_pos.inv_freq"))}
        sd = fuse_weight_norm(sd)
        own = self.state_dict()
        missing = sorted(set(own) - set(sd))
        unexpected = sorted(set(sd) - set(own))
        bad = [f"{k}: {tuple(sd[k].shape)} != {tuple(own[k].shape)}" for k in own
               if k in sd and sd[k].shape != own[k].shape]
        if missing or unexpected or bad:
            raise ValueError(f"SNAC checkpoint {source}: missing decoder weights {missing}; "
                             f"unexpected keys {unexpected}; shape mismatches {bad}")
        self.load_state_dict(sd)

    def _blocks(self) -> list[_DecoderBlock]:
        return [m for m in self.decoder.model if isinstance(m, _DecoderBlock)]

    def _block_rate(self, layer: int) -> int:
        """Samples per frame at the output of decoder block `layer`."""
        return max(self.config.vq_strides) * math.prod(self.config.decoder_rates[: layer + 1])

    def layer_noise(self, noise_seed: Tensor, frame_offset: Tensor, layer: int, start: int, length: int) -> Tensor:
        """float32 noise [B, 1, length] of decoder block `layer` at its window columns start.. (absolute
        index frame_offset * samples_per_frame_of_the_layer + column)."""
        # the layer id enters through the seed (xor with a per-layer constant)
        lseed = noise_seed.to(torch.int64) ^ (((layer + 1) * 0x9E3779B97F4A7C15) & (2**63 - 1))
        return _hash_normal(lseed, frame_offset.to(torch.int64) * self._block_rate(layer) + start, length)[:, None]

    def noise(self, noise_seed: Tensor, frame_offset: Tensor | None, frames: int) -> list[Tensor]:
        """Per decoder block i: float32 noise [B, 1, frames * spf_i] at absolute index offset*spf_i + t."""
        if frame_offset is None:
            frame_offset = torch.zeros_like(noise_seed)
        return [self.layer_noise(noise_seed, frame_offset, i, 0, frames * self._block_rate(i))
                for i in range(len(self.config.decoder_rates))]

    def crop_plan(self, latent_len: int, keep: tuple[int, int]) -> list[tuple[int, int]]:
        """Per decoder block: the columns [start, stop) of its input (at its rate, in window columns) that
        output samples keep = [start, stop) depend on. The convolutions pad with zeros at the window's
        ends only, so the kept samples computed from these columns equal the whole window's."""
        blocks, lengths = self._blocks(), [latent_len]
        for block in blocks:
            lengths.append(block.output_length(lengths[-1]))
        lo, hi = keep
        if not 0 <= lo < hi <= lengths[-1]:
            raise ValueError(f"SNAC decode: kept samples {keep} outside the window's {lengths[-1]}")
        left, right = _conv_reach(self._tail_conv())
        lo, hi = max(lo - left, 0), min(hi + right, lengths[-1])
        spans = []
        for i in reversed(range(len(blocks))):
            left, right = blocks[i].unit_reach()
            lo, hi = blocks[i].input_span(max(lo - left, 0), min(hi + right, lengths[i + 1]), lengths[i])
            spans.append((lo, hi))
        return spans[::-1]

    @staticmethod
    def _layer(m: nn.Module, z: Tensor) -> Tensor:
        """A layer outside the decoder blocks; convolutions through rt/codec_kernels' kernels on GPUs."""
        return codec_kernels.conv1d(m, z) if isinstance(m, nn.Conv1d) else m(z)

    def _tail_conv(self) -> nn.Conv1d:
        return next(m for m in reversed(self.decoder.model) if isinstance(m, nn.Conv1d))

    def decode(self, codes: list[Tensor], noise_seed: Tensor | None = None,
               frame_offset: Tensor | None = None, keep: tuple[int, int] | None = None) -> Tensor:
        """codes[l]: [B, F * codes_per_level[l]] -> audio [B, 1, F * samples_per_frame], or with
        keep = (start, stop) only those samples of the window [B, 1, stop - start], computed from the
        columns they depend on (a streaming window keeps a quarter of its samples).

        noise_seed / frame_offset: int64 [B] or None (None seed: noise blocks contribute zero).
        """
        z = sum(q(c) for q, c in zip(self.quantizer.quantizers, codes, strict=True))
        frames = z.shape[-1] // max(self.config.vq_strides)
        if noise_seed is not None and frame_offset is None:
            frame_offset = torch.zeros_like(noise_seed)
        use_noise = noise_seed is not None and self.config.noise
        layers = list(self.decoder.model)
        first = next(i for i, m in enumerate(layers) if isinstance(m, _DecoderBlock))
        for m in layers[:first]:  # the latent-rate layers, over the whole window (the blocks need nearly all)
            z = self._layer(m, z)
        keep = keep or (0, frames * self.config.samples_per_frame)
        start = 0  # the window column of z's first column, at z's rate
        for i, (block, (lo, hi)) in enumerate(zip(self._blocks(), self.crop_plan(z.shape[-1], keep), strict=True)):
            x = z[..., lo - start : hi - start]
            start = lo * block.stride
            length = block.output_length(hi - lo)
            noise = self.layer_noise(noise_seed, frame_offset, i, start, length) if use_noise else None
            z = block(x, noise)
        for m in layers[first + len(self.config.decoder_rates):]:  # Snake, the last convolution, tanh
            z = self._layer(m, z)
        return z[..., keep[0] - start : keep[1] - start]

    forward = decode

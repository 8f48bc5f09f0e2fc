"""Qwen3-TTS-Tokenizer-12Hz encoder (24 kHz audio -> codes [frames, 16]), for voice-cloning reference audio.

It is Mimi's encoder (Kyutai; the `encoder.*` half of `speech_tokenizer/`, a transformers `MimiModel`
config in `encoder_config`): a SEANet convolution stack (causal convolutions, ELU, residual blocks,
strided downsampling to 25 Hz), a transformer (LayerNorm, rope, layer scale, GELU MLP), a stride-2
convolution to 12.5 Hz, then a split residual vector quantizer: the first ("semantic") codebook
quantizes one projection of the frame, the remaining ("acoustic") codebooks a residual chain over
another projection of the same frame. The checkpoint holds more quantizers than the talker uses
(`encoder_valid_num_quantizers`, 16 of 32): only those are computed.

As the reference (transformers 4.57) runs it, the transformer attends causally over the whole clip
(the config's `sliding_window` is not applied), and the codes of a clip of n samples are its first
ceil(n / 1920) frames. It runs once per cloning request, off the per-step path, in float32.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.codecs.weight_norm import fuse_weight_norm
from vox_serve.layers.rope import RotaryEmbedding

CLUSTER_USAGE_EPS = 1e-5  # the reference codebook's epsilon (not in config.json)


@dataclass(frozen=True)
class CodecEncoderConfig:
    """Mimi's defaults (the released tokenizer's values as public ports describe them); config.json wins."""

    sampling_rate: int = 24000
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    compress: int = 2
    pad_mode: str = "constant"
    codebook_size: int = 2048
    codebook_dim: int = 256
    vector_quantization_hidden_dimension: int = 256
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8000
    attention_bias: bool = False
    valid_quantizers: int = 16  # the tokenizer config's encoder_valid_num_quantizers

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CodecEncoderConfig:
        """From the tokenizer's config.json (`encoder_config` inside) or a bare Mimi config."""
        enc = d.get("encoder_config", d)
        unsupported = {"use_causal_conv": True, "use_conv_shortcut": False, "hidden_act": "gelu", "audio_channels": 1}
        for key, want in unsupported.items():
            if enc.get(key, want) != want:
                raise ValueError(f"Qwen3-TTS codec encoder: {key}={enc[key]!r} is not supported")
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in enc.items()
              if k in cls.__dataclass_fields__ and k != "head_dim"}
        hidden, heads = enc.get("hidden_size", cls.hidden_size), enc.get("num_attention_heads", cls.num_attention_heads)
        return cls(**kw, head_dim=enc.get("head_dim") or hidden // heads,
                   valid_quantizers=d.get("encoder_valid_num_quantizers", cls.valid_quantizers))

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsampling_ratios) * 2  # the SEANet strides, then the stride-2 downsampling


class CausalConv(nn.Module):
    """Conv1d padded on the left by kernel - stride, and on the right just enough for a whole last step."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 pad_mode: str = "constant") -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.stride, self.pad_mode = stride, pad_mode
        self.effective_kernel = (kernel - 1) * dilation + 1

    def forward(self, x: Tensor) -> Tensor:
        left = self.effective_kernel - self.stride
        steps = math.ceil((x.shape[-1] - self.effective_kernel + left) / self.stride + 1) - 1
        right = steps * self.stride + self.effective_kernel - left - x.shape[-1]
        return self.conv(F.pad(x, (left, right), mode=self.pad_mode))


class ResnetBlock(nn.Module):
    def __init__(self, dim: int, hidden: int, kernel: int, dilation: int, pad_mode: str) -> None:
        super().__init__()
        # Indices 1 and 3 hold the convolutions (0 and 2 are ELUs), as in the checkpoint's key names.
        self.block = nn.ModuleList([nn.ELU(), CausalConv(dim, hidden, kernel, dilation=dilation, pad_mode=pad_mode),
                                    nn.ELU(), CausalConv(hidden, dim, 1, pad_mode=pad_mode)])

    def forward(self, x: Tensor) -> Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


def seanet_layers(c: CodecEncoderConfig) -> nn.ModuleList:
    """audio [B, 1, n] -> [B, hidden, n / prod(ratios)]; module indices as in the checkpoint."""
    layers: list[nn.Module] = [CausalConv(1, c.num_filters, c.kernel_size, pad_mode=c.pad_mode)]
    width = c.num_filters
    for ratio in reversed(c.upsampling_ratios):
        layers += [ResnetBlock(width, width // c.compress, c.residual_kernel_size, c.dilation_growth_rate**j,
                               c.pad_mode) for j in range(c.num_residual_layers)]
        layers += [nn.ELU(), CausalConv(width, width * 2, ratio * 2, stride=ratio, pad_mode=c.pad_mode)]
        width *= 2
    layers += [nn.ELU(), CausalConv(width, c.hidden_size, c.last_kernel_size, pad_mode=c.pad_mode)]
    return nn.ModuleList(layers)


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class TransformerLayer(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.input_layernorm = nn.LayerNorm(d, eps=c.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(d, eps=c.norm_eps)
        self.self_attn = nn.ModuleDict({
            "q_proj": nn.Linear(d, self.heads * hd, bias=c.attention_bias),
            "k_proj": nn.Linear(d, self.kv_heads * hd, bias=c.attention_bias),
            "v_proj": nn.Linear(d, self.kv_heads * hd, bias=c.attention_bias),
            "o_proj": nn.Linear(self.heads * hd, d, bias=c.attention_bias)})
        self.mlp = nn.ModuleDict({"fc1": nn.Linear(d, c.intermediate_size, bias=False),
                                  "fc2": nn.Linear(c.intermediate_size, d, bias=False)})
        self.self_attn_layer_scale = LayerScale(d)
        self.mlp_layer_scale = LayerScale(d)

    def attention(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        """x [T, hidden] of one clip -> [T, hidden], causal."""
        a, t = self.self_attn, x.shape[0]
        q = a["q_proj"](x).view(t, self.heads, -1)
        k = a["k_proj"](x).view(t, self.kv_heads, -1)
        v = a["v_proj"](x).view(t, self.kv_heads, -1)
        q, k = rope(q, k, torch.arange(t, device=x.device))
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                             is_causal=True, enable_gqa=True)
        return a["o_proj"](out.transpose(0, 1).reshape(t, -1))

    def forward(self, x: Tensor, rope: RotaryEmbedding) -> Tensor:
        x = x + self.self_attn_layer_scale(self.attention(self.input_layernorm(x), rope))
        mlp = self.mlp["fc2"](F.gelu(self.mlp["fc1"](self.post_attention_layernorm(x))))
        return x + self.mlp_layer_scale(mlp)


class Codebooks(nn.Module):
    """A residual chain of nearest-neighbour codebooks behind a 1x1 input projection."""

    def __init__(self, c: CodecEncoderConfig, num_codebooks: int) -> None:
        super().__init__()
        dim = c.vector_quantization_hidden_dimension
        self.input_proj = nn.Conv1d(c.hidden_size, dim, 1, bias=False) if dim != c.hidden_size else None
        self.tables = nn.Parameter(torch.zeros(num_codebooks, c.codebook_size, dim))

    def forward(self, x: Tensor) -> Tensor:
        """x [hidden, frames] -> codes [frames, num_codebooks]."""
        residual = (self.input_proj(x[None])[0] if self.input_proj is not None else x).t()
        codes = []
        for table in self.tables:
            index = torch.cdist(residual[None], table[None])[0].argmin(dim=-1)
            residual = residual - table[index]
            codes.append(index)
        return torch.stack(codes, dim=1)


class Qwen3CodecEncoder(nn.Module):
    """24 kHz audio [samples] -> codes [ceil(samples / 1920), valid_quantizers] int64."""

    def __init__(self, config: CodecEncoderConfig) -> None:
        super().__init__()
        c = self.config = config
        if not c.num_semantic_quantizers < c.valid_quantizers <= c.num_quantizers:
            raise ValueError(f"Qwen3-TTS codec encoder: {c.valid_quantizers} valid quantizers of {c.num_quantizers} "
                             f"({c.num_semantic_quantizers} semantic) is not supported")
        self.encoder = seanet_layers(c)
        self.encoder_transformer = nn.ModuleList(TransformerLayer(c) for _ in range(c.num_hidden_layers))
        self.rope = RotaryEmbedding(c.head_dim, c.max_position_embeddings,
                                    {"rope_type": "default", "rope_theta": c.rope_theta})
        self.downsample = CausalConv(c.hidden_size, c.hidden_size, 4, stride=2, bias=False, pad_mode="replicate")
        self.semantic = Codebooks(c, c.num_semantic_quantizers)
        self.acoustic = Codebooks(c, c.valid_quantizers - c.num_semantic_quantizers)

    @property
    def max_samples(self) -> int:
        """The longest clip the transformer's rope table covers (25 Hz before downsampling)."""
        return self.config.max_position_embeddings * self.config.samples_per_frame // 2

    @torch.no_grad()
    def forward(self, audio: Tensor) -> Tensor:
        w = self.semantic.tables
        x = audio.to(w.device, w.dtype)[None, None]
        for layer in self.encoder:
            x = layer(x)
        h = x[0].t()  # [frames at 25 Hz, hidden]
        for layer in self.encoder_transformer:
            h = layer(h, self.rope)
        x = self.downsample(h.t()[None])[0]  # [hidden, frames at 12.5 Hz]
        codes = torch.cat([self.semantic(x), self.acoustic(x)], dim=1)
        return codes[: -(-audio.shape[-1] // self.config.samples_per_frame)]

    @classmethod
    def from_dir(cls, path: str, device: torch.device | str = "cpu") -> Qwen3CodecEncoder:
        """The encoder half of a `speech_tokenizer/` folder (config.json + model.safetensors)."""
        from safetensors import safe_open

        with open(os.path.join(path, "config.json")) as f:
            model = cls(CodecEncoderConfig.from_dict(json.load(f)))
        with safe_open(os.path.join(path, "model.safetensors"), framework="pt") as f:  # the decoder half stays unread
            sd = {k[len("encoder."):]: f.get_tensor(k) for k in f.keys() if k.startswith("encoder.")}
        model.load_checkpoint(sd, source=path)
        return model.to(device).eval()

    def load_checkpoint(self, sd: dict[str, Tensor], source: str) -> None:
        """Load the reference's `encoder.*` weights (prefix removed); raise on missing or unexpected ones."""
        sd = fuse_weight_norm(sd)
        values: dict[str, Tensor] = {}
        for key, value in sd.items():
            if key.startswith("encoder.layers."):
                values["encoder." + key[len("encoder.layers."):]] = value
            elif key.startswith("encoder_transformer.layers."):
                values["encoder_transformer." + key[len("encoder_transformer.layers."):]] = value
            elif key.startswith("downsample."):
                values[key] = value
        c = self.config
        for group, count in (("semantic", c.num_semantic_quantizers),
                             ("acoustic", c.valid_quantizers - c.num_semantic_quantizers)):
            prefix = f"quantizer.{group}_residual_vector_quantizer."
            if f"{prefix}input_proj.weight" in sd:
                values[f"{group}.input_proj.weight"] = sd[f"{prefix}input_proj.weight"]
            names = [(f"{prefix}layers.{i}.codebook.embed_sum", f"{prefix}layers.{i}.codebook.cluster_usage")
                     for i in range(count)]
            missing = [n for pair in names for n in pair if n not in sd]
            if missing:
                raise ValueError(f"Qwen3-TTS codec encoder {source}: missing weights "
                                 f"{['encoder.' + n for n in missing]}")
            # As the reference forms its codebooks: embed_sum / usage in the checkpoint's dtype.
            values[f"{group}.tables"] = torch.stack([sd[s] / sd[u].clamp(min=CLUSTER_USAGE_EPS)[:, None]
                                                    for s, u in names])
        own = self.state_dict()
        missing = sorted(set(own) - set(values))
        bad = [f"{k}: {tuple(v.shape)} != {tuple(own[k].shape)}" for k, v in values.items()
               if k in own and v.shape != own[k].shape]
        if missing or bad:
            raise ValueError(f"Qwen3-TTS codec encoder {source}: missing weights {missing[:8]}; "
                             f"shape mismatches {bad[:8]}")
        self.load_state_dict(values)

    @classmethod
    def random(cls, config: CodecEncoderConfig, seed: int, device: torch.device | str = "cpu") -> Qwen3CodecEncoder:
        """Random weights of the checkpoint's shapes (`--load-format dummy`); deterministic per seed."""
        g = torch.Generator().manual_seed(seed)
        model = cls(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("scale"):
                    p.fill_(0.01)  # Mimi's initial layer scale
                elif "norm" in name:
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif name.endswith("bias"):
                    p.zero_()
                elif name.endswith("tables"):
                    p.copy_(torch.randn(p.shape, generator=g))
                else:  # conv / linear weights: std 1/sqrt(fan in)
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
        return model.to(device).eval()

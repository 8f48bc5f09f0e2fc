"""Qwen3-TTS-Tokenizer-12Hz decoder (codes -> 24 kHz audio), our own implementation, with streaming.

Architecture (checked against PyPI ``qwen-tts`` 0.1.1, ``qwen_tts/core/tokenizer_12hz``): 16 code groups
(one "semantic" + 15 acoustic residual codebooks of 2048 entries each) -> summed, projected embeddings
[codebook_dim] -> causal conv (k=3) -> 8-layer transformer with a 72-frame sliding window -> two x2
transposed-conv + ConvNeXt upsamplers -> causal conv -> four SnakeBeta/transposed-conv/residual blocks
(x8, x5, x4, x3) -> SnakeBeta -> causal conv -> clamp to [-1, 1]: 1920 samples per 12.5 Hz frame. Every
layer is causal, so a request streams with a fixed-size state (see ``Qwen3CodecSlots``).

Loading reads the decoder half of a ``speech_tokenizer/`` folder (``config.json`` + ``model.safetensors``);
each codebook (``embedding_sum / cluster_usage``) is folded with its group's output projection into one
table at load time, and weight norm in any layout is fused.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.codecs.qwen3.layers import (
    CausalConv,
    CausalUpConv,
    ConvNeXtBlock,
    DecoderBlock,
    SlidingWindowTransformer,
    SnakeBeta,
    StatefulLayer,
)
from vox_serve.codecs.weight_norm import fuse_weight_norm

CLUSTER_USAGE_EPS = 1e-5  # the reference EuclideanCodebook's epsilon (not in config.json)


@dataclass(frozen=True)
class Qwen3CodecConfig:
    """Decoder geometry. Defaults: the released tokenizer's values as public ports describe them (unverified
    here: no real config is on this machine); a checkpoint's config.json always wins."""

    num_quantizers: int = 16
    codebook_size: int = 2048
    codebook_dim: int = 512
    latent_dim: int = 1024
    hidden_size: int = 512
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    attention_bias: bool = False
    sliding_window: int = 72
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    decoder_dim: int = 1536
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    sample_rate: int = 24000

    @property
    def samples_per_frame(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @classmethod
    def from_dict(cls, d: dict) -> Qwen3CodecConfig:
        """From the tokenizer's config.json (``decoder_config`` inside) or a bare decoder config."""
        dec = d.get("decoder_config", d)
        if "codebook_dim" not in dec:
            raise ValueError("Qwen3-TTS codec config: decoder_config has no codebook_dim")
        if dec.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Qwen3-TTS codec config: hidden_act {dec['hidden_act']!r} is not supported")
        names = set(cls.__dataclass_fields__) - {"head_dim", "rope_theta", "sample_rate"}
        kw = {k: dec[k] for k in names if k in dec}
        for k in ("upsample_rates", "upsampling_ratios"):
            if k in kw:
                kw[k] = tuple(int(r) for r in kw[k])
        hidden, heads = dec.get("hidden_size", cls.hidden_size), dec.get("num_attention_heads",
                                                                          cls.num_attention_heads)
        cfg = cls(**kw, head_dim=dec.get("head_dim") or hidden // heads, rope_theta=_rope_theta(dec),
                  sample_rate=d.get("output_sample_rate", cls.sample_rate))
        upsample = d.get("decode_upsample_rate", cfg.samples_per_frame)
        if upsample != cfg.samples_per_frame:
            raise ValueError(f"Qwen3-TTS codec config: decode_upsample_rate {upsample} != product of the "
                             f"decoder's rates {cfg.samples_per_frame}")
        return cfg


def _rope_theta(dec: dict) -> float:
    """rope_theta (+ rope_scaling, transformers 4.x) or rope_parameters (5.x); only plain RoPE exists here."""
    params = dec.get("rope_parameters") or dec.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ValueError(f"Qwen3-TTS codec config: rope type {kind!r} is not supported")
    return float(params.get("rope_theta", dec.get("rope_theta", Qwen3CodecConfig.rope_theta)))


class ProjectedCodebooks(nn.Module):
    """All groups' codebooks with their output projections folded in: codes [B, N, Q] -> [B, codebook_dim, N]."""

    def __init__(self, num_quantizers: int, codebook_size: int, dim: int):
        super().__init__()
        self.codebook_size = codebook_size
        self.tables = nn.Parameter(torch.zeros(num_quantizers, codebook_size, dim))
        self.register_buffer("offsets", torch.arange(num_quantizers) * codebook_size, persistent=False)

    def forward(self, codes: Tensor) -> Tensor:
        # out-of-range codes are clamped rather than read out of bounds (the reference clamps -1 padding to 0)
        idx = codes.clamp(0, self.codebook_size - 1) + self.offsets
        emb = F.embedding(idx, self.tables.flatten(0, 1))  # [B, N, Q, dim]
        return emb.float().sum(dim=2).to(self.tables.dtype).transpose(1, 2)


class Qwen3CodecDecoder(nn.Module):
    """Codes [B, T, 16] -> audio; ``decode`` for whole utterances, ``Qwen3CodecSlots`` for streams."""

    def __init__(self, config: Qwen3CodecConfig):
        super().__init__()
        self.config = c = config
        self.quantizer = ProjectedCodebooks(c.num_quantizers, c.codebook_size, c.codebook_dim)
        self.pre_conv = CausalConv(c.codebook_dim, c.latent_dim, 3)
        self.pre_transformer = SlidingWindowTransformer(
            c.latent_dim, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.intermediate_size, c.sliding_window, c.rope_theta, c.rms_norm_eps,
            c.layer_scale_initial_scale, c.attention_bias)
        self.upsample = nn.ModuleList(nn.ModuleList([CausalUpConv(c.latent_dim, c.latent_dim, r, r),
                                                     ConvNeXtBlock(c.latent_dim)]) for r in c.upsampling_ratios)
        dims = [c.decoder_dim // 2**i for i in range(len(c.upsample_rates) + 1)]
        self.decoder = nn.ModuleList([
            CausalConv(c.latent_dim, c.decoder_dim, 7),
            *(DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(c.upsample_rates)),
            SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7)])
        stateful = [(n, m) for n, m in self.named_modules()
                    if isinstance(m, StatefulLayer) and m.state_shape() is not None]
        for i, (_, m) in enumerate(stateful):
            m.state_id = i
        self.state_names = [n for n, _ in stateful]
        self.state_shapes = [m.state_shape() for _, m in stateful]

    @property
    def device(self) -> torch.device:
        return self.quantizer.tables.device

    @property
    def dtype(self) -> torch.dtype:
        return self.quantizer.tables.dtype

    def new_states(self, batch: int) -> list[Tensor]:
        """Fresh streaming state of ``batch`` requests: zeros, i.e. the reference's zero left padding."""
        return [torch.zeros(batch, *s, device=self.device, dtype=self.dtype) for s in self.state_shapes]

    def forward_chunk(self, codes: Tensor, states: list[Tensor], pos: Tensor) -> Tensor:
        """codes [B, N, Q] of frames pos[b] .. pos[b]+N-1 -> pcm [B, N * samples_per_frame] in [-1, 1].

        ``states`` (per ``state_shapes``, batch first) is read and its entries replaced by the new state.
        Static shapes, no host synchronisation.
        """
        if codes.shape[-1] != self.config.num_quantizers:
            raise ValueError(f"expected {self.config.num_quantizers} code groups per frame, got {codes.shape[-1]}")
        h = self.pre_conv(self.quantizer(codes), states)
        h = self.pre_transformer(h.transpose(1, 2), states, pos).transpose(1, 2)
        for up, convnext in self.upsample:
            h = convnext(up(h, states), states)
        for m in self.decoder:
            h = m(h, states)
        return h.clamp(-1.0, 1.0)[:, 0]

    @torch.no_grad()
    def decode(self, codes: Tensor, max_chunk_frames: int = 300) -> Tensor:
        """codes [B, T, Q] -> pcm [B, T * samples_per_frame] float, the exact causal decode.

        Runs through a fresh state ``max_chunk_frames`` at a time to bound memory; the result does not
        depend on it (streaming is exact).
        """
        states = self.new_states(codes.shape[0])
        pos = torch.zeros(codes.shape[0], dtype=torch.int64, device=codes.device)
        out = [torch.zeros(codes.shape[0], 0, device=self.device, dtype=self.dtype)]  # T = 0: empty audio
        for start in range(0, codes.shape[1], max_chunk_frames):
            chunk = codes[:, start:start + max_chunk_frames]
            out.append(self.forward_chunk(chunk, states, pos))
            pos = pos + chunk.shape[1]
        return torch.cat(out, dim=-1)

    @classmethod
    def from_dir(cls, path: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
                 ) -> Qwen3CodecDecoder:
        """Load a ``speech_tokenizer/`` folder (or a Qwen3-TTS checkpoint folder containing one)."""
        if os.path.exists(os.path.join(path, "speech_tokenizer", "config.json")):
            path = os.path.join(path, "speech_tokenizer")
        with open(os.path.join(path, "config.json")) as f:
            model = cls(Qwen3CodecConfig.from_dict(json.load(f)))
        weights = os.path.join(path, "model.safetensors")
        if not os.path.exists(weights):
            raise FileNotFoundError(f"Qwen3-TTS codec checkpoint {path}: no model.safetensors")
        from safetensors import safe_open

        with safe_open(weights, framework="pt") as f:  # the encoder half is never read
            sd = {k: f.get_tensor(k) for k in f.keys() if k.startswith("decoder.")}
        model.load_decoder_state_dict(sd, source=path)
        return model.to(device=device, dtype=dtype).eval()

    def load_decoder_state_dict(self, sd: dict[str, Tensor], source: str = "state dict") -> None:
        """Load the reference's ``decoder.*`` weights (any weight-norm layout); raise on any mismatch."""
        sd = fuse_weight_norm({k[len("decoder."):]: v for k, v in sd.items() if k.startswith("decoder.")})
        for group in ("rvq_first", "rvq_rest"):  # the encoder's projection into the codebooks
            sd.pop(f"quantizer.{group}.input_proj.weight", None)
        tables, missing = fold_codebooks(sd, self.config)  # consumes the quantizer keys it uses
        own = {k: v for k, v in self.state_dict().items() if k != "quantizer.tables"}
        missing += sorted(set(own) - set(sd))
        unexpected = sorted(set(sd) - set(own))
        bad = [f"{k}: {tuple(sd[k].shape)} != {tuple(own[k].shape)}" for k in own
               if k in sd and sd[k].shape != own[k].shape]
        if missing or unexpected or bad:
            p = "decoder."
            raise ValueError(f"Qwen3-TTS codec checkpoint {source}: missing decoder weights "
                             f"{[p + k for k in missing]}; unexpected keys {[p + k for k in unexpected]}; "
                             f"shape mismatches {[p + b for b in bad]}")
        self.load_state_dict({**sd, "quantizer.tables": tables})

    @classmethod
    def random(cls, config: Qwen3CodecConfig, seed: int = 0, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> Qwen3CodecDecoder:
        """Random weights of the checkpoint's shapes (``--load-format dummy``); deterministic per seed."""
        g = torch.Generator().manual_seed(seed)
        model = cls(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if name == "quantizer.tables":  # the sum over the groups has unit scale
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(config.num_quantizers))
                elif leaf in ("alpha", "beta", "bias"):
                    p.zero_()
                elif leaf in ("scale", "gamma"):
                    p.fill_(config.layer_scale_initial_scale)
                elif "norm" in name:
                    p.fill_(1.0)
                else:  # conv / linear weights: std 1/sqrt(fan in); residual branches damped (audio std ~0.1)
                    damp = 0.1 if ".conv2." in name else 1.0
                    p.copy_(torch.randn(p.shape, generator=g) * (damp / math.sqrt(p[0].numel())))
        return model.to(device=device, dtype=dtype).eval()


def fold_codebooks(sd: dict[str, Tensor], cfg: Qwen3CodecConfig) -> tuple[Tensor | None, list[str]]:
    """The reference's split RVQ (group 0: ``rvq_first``, groups 1..: ``rvq_rest``) -> tables [Q, K, dim].

    Table q = (embedding_sum / clamp(cluster_usage, 1e-5)) @ output_proj^T, formed in float64. Pops the
    keys it uses from ``sd``; returns (tables or None, missing keys).
    """
    tables, missing = [], []
    for q in range(cfg.num_quantizers):
        group, layer = ("quantizer.rvq_first.", q) if q == 0 else ("quantizer.rvq_rest.", q - 1)
        names = [f"{group}vq.layers.{layer}._codebook.embedding_sum",
                 f"{group}vq.layers.{layer}._codebook.cluster_usage", f"{group}output_proj.weight"]
        if any(n not in sd for n in names):
            missing += [n for n in names if n not in sd]
            continue
        emb_sum, usage, proj = (sd[n].double() for n in names)
        tables.append((emb_sum / usage.clamp(min=CLUSTER_USAGE_EPS)[:, None]) @ proj.flatten(1).T)
        for n in names[:2]:
            sd.pop(n)
    for group in ("rvq_first", "rvq_rest"):  # shared by the group's codebooks: popped once all are folded
        sd.pop(f"quantizer.{group}.output_proj.weight", None)
    if missing:
        return None, missing
    return torch.stack(tables).float(), []


class Qwen3CodecSlots:
    """Streaming state of up to ``num_slots`` requests in preallocated pools indexed by slot.

    Pools: ``state`` [num_slots, state_numel] in the decoder's dtype, the concatenation of every causal
    layer's left context and the transformer's key/value window (names and shapes in ``layout()``), and
    ``pos`` [num_slots] int64, the next frame's index. ``decode_chunk`` reads and writes only the slots it
    is given, with static shapes and no host synchronisation, so one captured graph per (batch, frames)
    serves any set of requests.
    """

    def __init__(self, decoder: Qwen3CodecDecoder, num_slots: int):
        self.decoder = decoder
        self.shapes = decoder.state_shapes
        self.sizes = [math.prod(s) for s in self.shapes]
        self.state = torch.zeros(num_slots, sum(self.sizes), device=decoder.device, dtype=decoder.dtype)
        self.pos = torch.zeros(num_slots, device=decoder.device, dtype=torch.int64)

    def layout(self) -> list[tuple[str, tuple[int, ...]]]:
        """(layer, per-slot shape) of each state entry, in pool order."""
        return list(zip(self.decoder.state_names, self.shapes, strict=True))

    @torch.no_grad()
    def decode_chunk(self, codes: Tensor, slots: Tensor) -> Tensor:
        """codes [B, N, Q] (the next N frames of each request), slots [B] int64 (distinct) -> pcm [B, N * 1920]."""
        b = codes.shape[0]
        flat = self.state.index_select(0, slots)
        states = [part.unflatten(1, s) for part, s in zip(flat.split(self.sizes, dim=1), self.shapes, strict=True)]
        pos = self.pos.index_select(0, slots)
        pcm = self.decoder.forward_chunk(codes, states, pos)
        self.state.index_copy_(0, slots, torch.cat([s.reshape(b, -1) for s in states], dim=1))
        self.pos.index_copy_(0, slots, pos + codes.shape[1])
        return pcm

    def reset_slots(self, slots: Tensor) -> None:
        """Make ``slots`` [K] int64 fresh (graph-safe)."""
        self.state.index_fill_(0, slots, 0)
        self.pos.index_fill_(0, slots, 0)

    def reset_slot(self, slot: int) -> None:
        self.state[slot].zero_()
        self.pos[slot] = 0

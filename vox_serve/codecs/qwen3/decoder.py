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
from torch import Tensor, nn

from vox_serve.codecs.codebooks import ProjectedCodebooks, projected_table
from vox_serve.codecs.qwen3.layers import ConvNeXtBlock, DecoderBlock, SlidingWindowTransformer, SnakeBeta
from vox_serve.codecs.slots import CodecSlots
from vox_serve.codecs.streaming import (
    CausalConv,
    CausalUpConv,
    StatefulLayer,
    StreamingCodecDecoder,
    assign_state_ids,
)
from vox_serve.codecs.weight_norm import fuse_weight_norm

Qwen3CodecSlots = CodecSlots  # the shared slot pool; the name the Qwen3-TTS program and tests use


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


def context_frames(layers: list[StatefulLayer]) -> int:
    """Frames of input that the final states of a causal stack (`layers` in order, the first at the frame
    rate) depend on: each layer's context in its input's time steps, over that rate, summed; rounded up, plus
    one for the transposed convs' sub-frame alignment."""
    rate, total = 1, 0.0
    for m in layers:
        total += getattr(m, "context_len", 0) / rate
        rate *= getattr(m, "stride", 1)
    return math.ceil(total) + 1


def _rope_theta(dec: dict) -> float:
    """rope_theta (+ rope_scaling, transformers 4.x) or rope_parameters (5.x); only plain RoPE exists here."""
    params = dec.get("rope_parameters") or dec.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ValueError(f"Qwen3-TTS codec config: rope type {kind!r} is not supported")
    return float(params.get("rope_theta", dec.get("rope_theta", Qwen3CodecConfig.rope_theta)))


class Qwen3CodecDecoder(StreamingCodecDecoder):
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
        self.state_names, self.state_shapes = assign_state_ids(self)
        tail = [m for part in (self.upsample, self.decoder) for m in part.modules() if isinstance(m, StatefulLayer)]
        self.tail_state_ids = [m.state_id for m in tail if m.state_shape() is not None]
        self.tail_context_frames = context_frames(tail)

    def forward_chunk(self, codes: Tensor, states: list[Tensor], pos: Tensor) -> Tensor:
        """codes [B, N, Q] of frames pos[b] .. pos[b]+N-1 -> pcm [B, N * samples_per_frame] in [-1, 1].

        ``states`` (per ``state_shapes``, batch first) is read and its entries replaced by the new state.
        Static shapes, no host synchronisation.
        """
        return self._synthesize(self._latents(codes, states, pos), states)

    def _latents(self, codes: Tensor, states: list[Tensor], pos: Tensor, valid: Tensor | None = None) -> Tensor:
        """codes [B, N, Q] -> the transformer's output [B, latent, N] at the frame rate; `valid` [B, N] zeroes
        the embeddings of frames that do not exist (a fresh state's left padding)."""
        if codes.shape[-1] != self.config.num_quantizers:
            raise ValueError(f"expected {self.config.num_quantizers} code groups per frame, got {codes.shape[-1]}")
        x = self.quantizer(codes)
        if valid is not None:
            x = x * valid[:, None, :].to(x.dtype)
        h = self.pre_conv(x, states)
        return self.pre_transformer(h.transpose(1, 2), states, pos).transpose(1, 2)

    def _synthesize(self, h: Tensor, states: list[Tensor]) -> Tensor:
        """The upsampling tail: latents [B, latent, N] -> pcm [B, N * samples_per_frame]."""
        for up, convnext in self.upsample:
            h = convnext(up(h, states), states)
        *body, act, out = self.decoder
        for m in body:
            h = m(h, states)
        return out(h, states, act=act).clamp(-1.0, 1.0)[:, 0]

    def prime(self, codes: Tensor, lengths: Tensor, states: list[Tensor]) -> None:
        """Fresh ``states`` of B requests -> their state after decoding frames codes[b, :lengths[b]] of codes
        [B, F, Q] (the audio is not formed). Static shapes, no host synchronisation.

        The prefixes are right-aligned in the F-frame window, so every one ends where the window ends and the
        states to keep are the ones a chunk leaves; frame j of row b is prefix frame j - (F - lengths[b]), at
        that (negative for padding) position. Padding is invisible to the real frames: its embeddings are
        zeroed (the causal conv's fresh context is zeros) and the windowed attention never shows a key at a
        negative position. The transformer runs over the whole window in one pass; the tail (upsampling convs,
        whose states reach back only `tail_context_frames`) only over the last frames, one frame at a time,
        each row's state advancing only on its real frames, so that a short prefix starts from the fresh state.
        """
        f = codes.shape[1]
        start = f - lengths  # [B]: the window frame holding each row's first prefix frame
        source = torch.arange(f, device=codes.device)[None, :] - start[:, None]  # [B, F]
        valid = source >= 0
        aligned = codes.gather(1, source.clamp(min=0)[..., None].expand(-1, -1, codes.shape[2]))
        h = self._latents(aligned, states, -start, valid)
        w = min(f, self.tail_context_frames)
        for j in range(f - w, f):
            trial = list(states)
            self._synthesize(h[..., j:j + 1], trial)
            keep = valid[:, j]
            for i in self.tail_state_ids:
                states[i] = torch.where(keep.view(-1, *[1] * (states[i].dim() - 1)), trial[i], states[i])

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
        tables.append(projected_table(*(sd[n] for n in names)))
        for n in names[:2]:
            sd.pop(n)
    for group in ("rvq_first", "rvq_rest"):  # shared by the group's codebooks: popped once all are folded
        sd.pop(f"quantizer.{group}.output_proj.weight", None)
    if missing:
        return None, missing
    return torch.stack(tables).float(), []

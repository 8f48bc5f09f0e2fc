"""The pre-norm transformer decoder layer shared by the Llama-style and Qwen3-style models.

RMSNorm -> fused q/k/v -> attention -> o_proj, then RMSNorm -> fused gate/up SwiGLU -> down_proj.
Attention is whatever `attend` does with q, k, v and the `QKPrep` that says how q and k are prepared
(optional per-head q/k RMSNorm, Qwen3; rope): the paged KV backend for LMs, a static cache for a depth
transformer; on GPUs the preparation and the KV write are one kernel.

The residual stream is carried across layers (`run_layers`): a layer takes the stream and the previous
layer's MLP output un-added, and its first op adds them with its input norm (`RMSNorm.add_norm`: one
kernel on GPUs); the stack's final norm does the last add. On CPU the same adds run in the same order
as a layer that adds its own output, so the results are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.rt import fp8_gemm, small_gemm, triton_ops
from vox_serve.rt.attention import AttentionBackend, AttentionBuffers
from vox_serve.rt.attention.kv_write import QKPrep

# (layer, q [T,Hq,D], k, v [T,Hkv,D] as projected, how to prepare q and k) -> [T,Hq,D]
Attend = Callable[[int, Tensor, Tensor, Tensor, QKPrep], Tensor]


@dataclass(frozen=True)
class DecoderDims:
    """The sizes of a decoder stack, as transformers' config.json files of Llama and Qwen models give them."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float

    @staticmethod
    def fields_from_hf(cfg: dict[str, Any], default_eps: float) -> dict[str, Any]:
        """The DecoderDims fields of a config.json (KV heads default to the heads, head_dim to width / heads)."""
        heads = cfg["num_attention_heads"]
        return dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                    intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
                    num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
                    head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                    rms_norm_eps=cfg.get("rms_norm_eps", default_eps))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor, delta: Tensor | None = None) -> Tensor:
        """RMSNorm(x), or RMSNorm(x + delta) when a delta is given."""
        if delta is not None:
            return self.add_norm(x, delta)[1]
        if x.is_cuda:  # one fused kernel (math in float32, the weight applied before the cast back)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def add_norm(self, x: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
        """(x + delta, RMSNorm(x + delta)): one kernel on GPUs (Triton)."""
        if triton_ops.enabled(x):
            return triton_ops.add_rms_norm(x, delta, self.weight, self.eps)
        x = x + delta
        return x, self(x)


class DecoderLayer(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, eps: float, layer_id: int, qk_norm: bool = False) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.split = (q_size, kv_size, kv_size)
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.qkv_proj = nn.Linear(hidden_size, sum(self.split), bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)
        self.qk_norm = qk_norm
        self.o_proj = nn.Linear(q_size, hidden_size, bias=False)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor, delta: Tensor | None, positions: Tensor, rope: RotaryEmbedding,
                attend: Attend) -> tuple[Tensor, Tensor]:
        """x [T, hidden] the residual stream, delta [T, hidden] the previous layer's output not yet added to it
        (None before the first layer), positions [T] -> (the stream after attention, this layer's MLP output)."""
        t = x.shape[0]
        x, qkv = self._attention_input(x, delta)
        q, k, v = qkv.split(self.split, dim=-1)
        shape = (t, self.num_kv_heads, self.head_dim)
        norms = dict(q_norm=self.q_norm, k_norm=self.k_norm) if self.qk_norm else {}
        prep = QKPrep(rope=rope, positions=positions, **norms)
        out = attend(self.layer_id, q.view(t, self.num_heads, self.head_dim), k.view(shape), v.view(shape), prep)
        return self._mlp(x, project(self.o_proj, out.reshape(t, -1)))

    def _attention_input(self, x: Tensor, delta: Tensor | None) -> tuple[Tensor, Tensor]:
        """(stream, qkv): the residual add, the input norm and the qkv projection (one kernel at a few rows)."""
        norm = self.input_layernorm
        qkv = self.qkv_proj
        fused = (small_gemm.norm_linear(x, delta, norm, qkv.weight, scale=weight_scale(qkv)) if qkv.bias is None
                 else None)
        if fused is not None:
            return fused
        return norm_project(norm, x, delta, qkv) if delta is not None else (x, qkv(norm(x)))

    def _mlp(self, x: Tensor, attn_out: Tensor) -> tuple[Tensor, Tensor]:
        """(stream, MLP output): the residual add and the norm, the gate/up projection with its gate folded into
        it or into the down projection where a small-rows kernel is measured for the shape, then the down one."""
        norm = self.post_attention_layernorm
        fused = small_gemm.norm_gated(x, attn_out, norm, self.gate_up_proj.weight,
                                      scale=weight_scale(self.gate_up_proj))
        if fused is not None:
            return fused[0], project(self.down_proj, fused[1])
        x, gate_up = norm_project(norm, x, attn_out, self.gate_up_proj)
        down = small_gemm.gated_linear(gate_up, self.down_proj.weight, self.down_proj.bias,
                                       scale=weight_scale(self.down_proj))
        return x, (gated_project(self.down_proj, gate_up) if down is None else down)


def project(linear: nn.Module, x: Tensor) -> Tensor:
    """linear(x) for x [T, in]: one small-rows kernel where one is measured for the shape (`rt.small_gemm`)."""
    y = small_gemm.linear(x, linear.weight, linear.bias, scale=weight_scale(linear))
    return linear(x) if y is None else y


def norm_project(norm: RMSNorm, x: Tensor, delta: Tensor, linear: nn.Module) -> tuple[Tensor, Tensor]:
    """(x + delta, linear(RMSNorm(x + delta))) where no small-rows kernel fuses them: the add and the norm one
    kernel on GPUs, which also quantizes the rows for a float8 projection's GEMM (`float8_gemm`)."""
    if float8_gemm(linear, x):
        x, hq, h_scale = triton_ops.add_rms_norm_fp8(x, delta, norm.weight, norm.eps)
        return x, fp8_gemm.scaled_mm(hq, h_scale, linear.weight, linear.weight_scale, linear.bias, x.dtype)
    x, h = norm.add_norm(x, delta)
    return x, linear(h)


def gated_project(linear: nn.Module, gate_up: Tensor) -> Tensor:
    """linear(silu(gate) * up) for gate_up [T, 2 * in] where no small-rows kernel folds the gate in: the gate one
    kernel on GPUs, which also quantizes the rows for a float8 projection's GEMM."""
    if not triton_ops.enabled(gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return project(linear, F.silu(gate) * up)
    scale = weight_scale(linear)
    gated = gate_up[:, : linear.weight.shape[1]]  # shaped as the gate's output: what the table lookup reads
    if float8_gemm(linear, gate_up) and not small_gemm.serves(gated, linear.weight, scale=scale):
        hq, h_scale = triton_ops.silu_mul_fp8(gate_up)
        return fp8_gemm.scaled_mm(hq, h_scale, linear.weight, scale, linear.bias, gate_up.dtype)
    return project(linear, triton_ops.silu_mul(gate_up))


def float8_gemm(linear: nn.Module, x: Tensor) -> bool:
    """Whether `linear` is a float8 projection that runs cuBLASLt's float8 GEMM (rt/fp8_gemm) on rows like x: a
    GPU with Triton, where the kernel before it can quantize the rows."""
    return weight_scale(linear) is not None and triton_ops.enabled(x) and x.dim() == 2


def weight_scale(linear: nn.Module) -> Tensor | None:
    """The per-row scales of a float8 projection (layers/fp8.Fp8Linear, `--quantization fp8`), else None."""
    return getattr(linear, "weight_scale", None)


def paged_attend(attention: AttentionBackend, bufs: AttentionBuffers) -> Attend:
    """`attend` over a paged KV backend, with one launch's buffers."""
    def attend(layer: int, q: Tensor, k: Tensor, v: Tensor, prep: QKPrep) -> Tensor:
        return attention.forward(layer, q, k, v, bufs, prep)
    return attend


def run_layers(layers: Iterable[DecoderLayer], x: Tensor, positions: Tensor, rope: RotaryEmbedding,
               attend: Attend) -> tuple[Tensor, Tensor | None]:
    """x [T, hidden] through the layers -> (stream, delta): the hidden states are stream + delta, which the
    stack's final norm adds (`norm(stream, delta)`); delta is None when there are no layers."""
    delta = None
    for layer in layers:
        x, delta = layer(x, delta, positions, rope, attend)
    return x, delta

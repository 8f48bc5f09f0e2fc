"""Streaming building blocks shared by the causal codec decoders (Qwen3-TTS 12 Hz, Mimi).

Every layer that looks back in time takes ``states``, a list of per-request left contexts indexed by the
layer's ``state_id`` (set by `assign_state_ids`; shapes from ``state_shape()``, batch first). A call reads
its context, runs on ``[context, input]`` and puts the new context back in the list. Zero contexts (and a
frame position of 0) are exactly a causal reference's zero left padding, so a one-shot decode is one call
on a fresh state and a stream of calls gives the same audio.

The windowed attention (`run_windowed`) keeps the rotated keys and values of the previous frames as its
state; with the frame position it gives every query exactly the keys a one-shot causal (optionally
sliding-window) pass would show it.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.rt import codec_kernels


class StatefulLayer(nn.Module):
    """A layer with per-request streaming state; ``state_id`` is its entry in the ``states`` list."""

    state_id: int = -1

    def state_shape(self) -> tuple[int, ...] | None:
        """Shape of one request's state (without the batch dim); None when the layer keeps none."""
        raise NotImplementedError


def assign_state_ids(model: nn.Module) -> tuple[list[str], list[tuple[int, ...]]]:
    """Number the model's stateful layers in module order; returns their names and per-request shapes."""
    stateful = [(n, m) for n, m in model.named_modules()
                if isinstance(m, StatefulLayer) and m.state_shape() is not None]
    for i, (_, m) in enumerate(stateful):
        m.state_id = i
    return [n for n, _ in stateful], [m.state_shape() for _, m in stateful]


class StreamingCodecDecoder(nn.Module):
    """A causal codec decoder: codes -> audio through per-request state (its stateful layers'). Subclasses set
    `state_names` / `state_shapes` (`assign_state_ids`) and implement `forward_chunk`; `CodecSlots` keeps the
    states of many requests."""

    state_names: list[str]
    state_shapes: list[tuple[int, ...]]

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def new_states(self, batch: int) -> list[Tensor]:
        """Fresh streaming state of `batch` requests: zeros, i.e. a causal reference's zero left padding."""
        return [torch.zeros(batch, *s, device=self.device, dtype=self.dtype) for s in self.state_shapes]

    def forward_chunk(self, codes: Tensor, states: list[Tensor], pos: Tensor) -> Tensor:
        """codes [B, N, Q] of frames pos[b] .. pos[b]+N-1 -> pcm [B, N * samples per frame]; `states` (per
        `state_shapes`, batch first) is read and its entries replaced by the new state. Static shapes, no
        host synchronisation."""
        raise NotImplementedError

    @torch.no_grad()
    def decode(self, codes: Tensor, max_chunk_frames: int = 300) -> Tensor:
        """codes [B, T, Q] -> pcm [B, T * samples per frame], the exact causal decode, `max_chunk_frames` at a
        time through a fresh state (bounds memory; the result does not depend on it: streaming is exact)."""
        states = self.new_states(codes.shape[0])
        pos = torch.zeros(codes.shape[0], dtype=torch.int64, device=codes.device)
        out = [torch.zeros(codes.shape[0], 0, device=self.device, dtype=self.dtype)]  # T = 0: empty audio
        for start in range(0, codes.shape[1], max_chunk_frames):
            chunk = codes[:, start:start + max_chunk_frames]
            out.append(self.forward_chunk(chunk, states, pos))
            pos = pos + chunk.shape[1]
        return torch.cat(out, dim=-1)


class Activation(Protocol):
    """An elementwise activation a causal convolution may apply to its input (`act=`), so that the
    activation and the join with the left context are one pass where a fused kernel exists."""

    def __call__(self, x: Tensor) -> Tensor: ...

    def with_context(self, x: Tensor, context: Tensor) -> Tensor:
        """cat([context, self(x)], -1)."""
        ...


def _input(x: Tensor, states: list[Tensor], state_id: int, context_len: int, act: Activation | None) -> Tensor:
    """A causal convolution's input: [left context, act(x)] (the new context put back in `states`)."""
    if not context_len:
        return x if act is None else act(x)
    context = states[state_id]
    x = torch.cat([context, x], dim=-1) if act is None else act.with_context(x, context)
    states[state_id] = x[..., -context_len:]
    return x


class CausalConv(StatefulLayer):
    """Stride-1 Conv1d padded on the left only; context: the last (kernel-1)*dilation inputs [C_in, ctx]
    (after `act`, when the call passes one)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context_len = (kernel - 1) * dilation

    def state_shape(self) -> tuple[int, ...] | None:
        return (self.conv.in_channels, self.context_len) if self.context_len else None

    def forward(self, x: Tensor, states: list[Tensor], act: Activation | None = None, bias: bool = True) -> Tensor:
        """[B, C_in, N] -> [B, C_out, N]: conv(act(x)) with the left context (`bias=False`: without the
        conv's bias, which the caller adds in a kernel after it)."""
        return codec_kernels.conv1d(self.conv, self.joined(x, states, act), bias)

    def joined(self, x: Tensor, states: list[Tensor], act: Activation | None = None) -> Tensor:
        """The convolution's input [B, C_in, context + N]: the left context, then act(x) (a fused kernel's)."""
        return _input(x, states, self.state_id, self.context_len, act)


class CausalUpConv(StatefulLayer):
    """ConvTranspose1d with its right overhang cut (output N*stride); context: the last ceil(k/s)-1 inputs."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, groups: int = 1, bias: bool = True):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride, groups=groups, bias=bias)
        self.stride = stride
        self.context_len = -(-kernel // stride) - 1

    def state_shape(self) -> tuple[int, ...] | None:
        return (self.conv.in_channels, self.context_len) if self.context_len else None

    def forward(self, x: Tensor, states: list[Tensor], act: Activation | None = None) -> Tensor:
        """[B, C_in, N] -> [B, C_out, N * stride]: the transposed conv of act(x) with the left context."""
        n = x.shape[-1]
        x = _input(x, states, self.state_id, self.context_len, act)
        start = self.context_len * self.stride
        return self.conv(x)[..., start:start + n * self.stride]


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE; x [B, H, N, D], cos/sin [B, 1, N, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class WindowedAttention(nn.Module):
    """Self-attention over cached (rotated) keys/values followed by the new positions' own."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=bias)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor, k_cache: Tensor, v_cache: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, N, dim]; caches [B, kv_heads, C, head_dim] (rotated keys); mask [B, 1, N, C+N] bool.

        Returns the output [B, N, dim] and the keys/values of all C+N positions.
        """
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        k, v = torch.cat([k_cache, k], dim=2), torch.cat([v_cache, v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1)), k, v


def window_rope(pos: Tensor, n: int, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos, sin [B, 1, N, head_dim] at positions pos[b] + i.

    The angle is formed in float64 from float32 frequencies (as references compute them), so long streams
    keep the precision a one-shot reference has at its small positions.
    """
    exponent = torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.int64).float() / head_dim
    inv_freq = (1.0 / theta ** exponent).double()
    frames = (pos[:, None] + torch.arange(n, device=pos.device)).double()
    angle = (frames[..., None] * inv_freq).repeat(1, 1, 2)[:, None]
    return angle.cos().to(dtype), angle.sin().to(dtype)


def window_mask(pos: Tensor, n: int, cache_len: int, window: int | None) -> Tensor:
    """[B, 1, N, C+N] bool: key k is visible to query q >= 0 iff 0 <= k <= q and (no window or q - k < window).

    Keys are the C = `cache_len` positions before pos[b] (negative ones do not exist yet) and the N new ones.
    """
    steps = torch.arange(-cache_len, n, device=pos.device)
    key = pos[:, None] + steps  # [B, C+N]
    query = key[:, cache_len:]  # [B, N]
    age = query[:, :, None] - key[:, None, :]
    # A query at a negative position (the left padding of a primed prefix, `Qwen3CodecDecoder.prime`) sees
    # only itself, so that no row is fully masked (some attention kernels give NaN there); real queries
    # never see a negative key.
    visible = ((key[:, None, :] >= 0) & (age >= 0)) | (age == 0)
    if window is not None:
        visible &= age < window
    return visible[:, None]


def run_windowed(layers: nn.ModuleList, h: Tensor, kv: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor
                 ) -> tuple[Tensor, Tensor]:
    """Layers `(h, rope, mask, k_cache, v_cache) -> (h, k, v)` over h [B, N, dim] with state kv
    [B, layers, 2, kv_heads, C, head_dim]; returns h and the state of the last C positions (same shape)."""
    cache_len = kv.shape[4]
    new_kv = []
    for i, layer in enumerate(layers):
        h, k, v = layer(h, rope, mask, kv[:, i, 0], kv[:, i, 1])
        keep = k.shape[2] - cache_len  # not k[:, :, -cache_len:], wrong for a cache of 0
        new_kv.append(torch.stack([k[:, :, keep:], v[:, :, keep:]], dim=1))
    return h, torch.stack(new_kv, dim=1)

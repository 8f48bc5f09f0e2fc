"""Triton kernels for the codecs' audio-rate layers, with the plain PyTorch code as their reference.

At large batch a codec launch is dominated by passes over audio-rate activations ([B, C, T] with T up
to a chunk's samples), and by PyTorch or cuDNN kernels that handle their shapes badly. Measured on the
H200 (Qwen3-TTS 12 Hz codec, 64 windows per launch, 41.5 ms): the Snake activations 7.0 ms (an int64
division per element), the last convolution (96 channels -> 1) 7.4 ms in cuDNN's generic implicit
GEMM, and the causal convolutions' `cat` of their left context 4.9 ms. Here:

- `snake(x, alpha, scale, context=None)`: `x + scale sin(alpha x)^2` per channel, one program per
  (row, block) so the channel is a scalar; with `context` [B, C, ctx] it returns
  `cat([context, snake(x)], -1)` in the same pass (what a causal convolution after it reads);
- `add_residual`: a residual unit's `x + conv(h)` with the convolution's bias added here (PyTorch adds
  a cuDNN convolution's bias in a broadcast pass of its own, ~0.1 ms per audio-rate conv at 64 windows);
- `conv1d_to_one`: a convolution with one output channel (the waveform), a dot product per sample;
- `depthwise_conv1d`: depthwise convolutions (PyTorch's generic kernel was a third of a SNAC window),
  optionally with the Snake after them in the same pass;
- dense stride-1 convolutions go to `rt/implicit_gemm.py`'s `conv_gemm` (an implicit GEMM on tensor cores with
  bias, a Snake, SNAC's noise scale and a residual add in its epilogue; `gemm_convs` says which ones), and SNAC's
  1x1 convolutions to its `pointwise_conv1d` (`fuses` says where);
- `folded_conv1d`: a dilated convolution as an undilated one over the `dilation` interleaved phases of
  its input (the same sums; cuDNN's default heuristics send some dilated shapes to a slow generic kernel,
  e.g. the Qwen3 codec's 384-channel dilation-9 convolution, 7.3 ms of a 28 ms launch at 64 windows);
- `conv1d(conv, x)`: `conv(x)` through the kernel above that fits, else PyTorch's;
- `conv_transpose1d(up, x)`: a transposed convolution as one GEMM and an overlap-add (`F.fold`) on GPUs,
  for one-window launches (cuDNN's kernels win from 16 windows on).

Used only for CUDA tensors when Triton imports; tests run them on the CPU through Triton's
interpreter (TRITON_INTERPRET=1) against the references.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor

from vox_serve.rt import triton_ops
from vox_serve.rt.implicit_gemm import conv_gemm, tap_weights
from vox_serve.rt.triton_ops import unit_last_stride

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton (CPU-only installs): the reference ops run instead
    triton = None

if triton is not None:

    # Sizes and strides are not specialised on (one compiled variant per dtype and block size).
    @triton.jit(do_not_specialize=["channels", "length", "ctx", "x_sb", "x_sc", "c_sb", "c_sc"])
    def _snake_kernel(x_ptr, ctx_ptr, alpha_ptr, scale_ptr, bias_ptr, out_ptr, channels, length, ctx, x_sb, x_sc,
                      c_sb, c_sc, HAS_CTX: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)  # batch * channels + channel
        b, c = (row // channels).to(tl.int64), row % channels
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # over ctx + length output columns (int32: the row's
        total = ctx + length  # base pointers carry the int64 offsets, so no per-element int64 arithmetic)
        inside = t < total
        alpha = tl.load(alpha_ptr + c).to(tl.float32)
        scale = tl.load(scale_ptr + c).to(tl.float32)
        from_x = inside & (t >= ctx)
        x = tl.load(x_ptr + (b * x_sb + c * x_sc) + (t - ctx), mask=from_x, other=0.0).to(tl.float32)
        if HAS_BIAS:  # the bias of the convolution before, added here instead of in a pass of its own
            x += tl.load(bias_ptr + c).to(tl.float32)
        y = x + scale * triton_ops.sin2(alpha * x)
        if HAS_CTX:
            kept = tl.load(ctx_ptr + (b * c_sb + c * c_sc) + t, mask=inside & (t < ctx), other=0.0).to(tl.float32)
            y = tl.where(t < ctx, kept, y)
        tl.store(out_ptr + row.to(tl.int64) * total + t, y.to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit(do_not_specialize=["channels", "length", "x_sb", "x_sc", "y_sb", "y_sc"])
    def _add_residual_kernel(x_ptr, y_ptr, bias_ptr, out_ptr, channels, length, x_sb, x_sc, y_sb, y_sc,
                             BLOCK: tl.constexpr):
        row = tl.program_id(0)  # batch * channels + channel
        b, c = (row // channels).to(tl.int64), row % channels
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = t < length
        x = tl.load(x_ptr + (b * x_sb + c * x_sc) + t, mask=inside, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + (b * y_sb + c * y_sc) + t, mask=inside, other=0.0).to(tl.float32)
        out = x + (y + tl.load(bias_ptr + c).to(tl.float32))
        tl.store(out_ptr + row.to(tl.int64) * length + t, out.to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit(do_not_specialize=["channels", "length_in", "length_out", "x_sb", "x_sc", "dilation", "padding"])
    def _conv_to_one_kernel(x_ptr, w_ptr, b_ptr, out_ptr, channels, length_in, length_out, x_sb, x_sc, dilation,
                            padding, K: tl.constexpr, HAS_BIAS: tl.constexpr, CB: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        t = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = t < length_out
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for c0 in range(0, channels, CB):
            cs = c0 + tl.arange(0, CB)
            cin = cs < channels
            for k in tl.static_range(K):
                src = t - padding + k * dilation
                ok = inside & (src >= 0) & (src < length_in)
                x = tl.load(x_ptr + b * x_sb + cs[:, None].to(tl.int64) * x_sc + src[None, :],
                            mask=cin[:, None] & ok[None, :], other=0.0).to(tl.float32)
                w = tl.load(w_ptr + cs * K + k, mask=cin, other=0.0).to(tl.float32)
                acc += tl.sum(x * w[:, None], axis=0)
        if HAS_BIAS:
            acc += tl.load(b_ptr).to(tl.float32)
        tl.store(out_ptr + b * length_out + t, acc.to(out_ptr.dtype.element_ty), mask=inside)

    # The taps' offsets are compile-time constants (one variant per dilation and padding: SNAC has three), and the
    # lengths are specialised on (divisibility by 16 lets the row pointers' alignment be known).
    @triton.jit(do_not_specialize=["channels"])
    def _depthwise_conv1d_kernel(x_ptr, w_ptr, b_ptr, alpha_ptr, scale_ptr, out_ptr, channels, length_in, length_out,
                                 DILATION: tl.constexpr, PADDING: tl.constexpr, K: tl.constexpr,
                                 HAS_BIAS: tl.constexpr, SNAKE: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)  # batch * channels + channel
        c = row % channels
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # int32: the row's base pointer carries the int64 part
        x_row = x_ptr + row.to(tl.int64) * length_in
        inside = t < length_out
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for k in tl.static_range(K):
            src = t + (k * DILATION - PADDING)
            ok = inside & (src >= 0) & (src < length_in)
            x = tl.load(x_row + src, mask=ok, other=0.0).to(tl.float32)
            acc += x * tl.load(w_ptr + c * K + k).to(tl.float32)
        if HAS_BIAS:
            acc += tl.load(b_ptr + c).to(tl.float32)
        if SNAKE:  # the Snake after the convolution, on its float32 sums
            acc += tl.load(scale_ptr + c).to(tl.float32) * triton_ops.sin2(tl.load(alpha_ptr + c).to(tl.float32) * acc)
        tl.store(out_ptr + row.to(tl.int64) * length_out + t, acc.to(out_ptr.dtype.element_ty), mask=inside)


def _row_block(length: int) -> tuple[int, int]:
    """(block, warps) for a row of `length` columns: short rows do not leave most lanes idle."""
    block = min(1024, max(64, triton.next_power_of_2(max(length, 1))))
    return block, max(1, block // 256)


def snake(x: Tensor, alpha: Tensor, scale: Tensor, context: Tensor | None = None, bias: Tensor | None = None
          ) -> Tensor:
    """x [B, C, T] (any batch and channel strides); alpha, scale: C values -> x + scale * sin(alpha x)^2 in
    x's dtype (math in float32), contiguous. With `context` [B, C, ctx]: cat([context, that], -1). With
    `bias` (C values), x + bias takes x's place (a convolution's bias, not added before).

    SNAC's Snake has scale = 1 / (alpha + 1e-9); the Qwen3 codec's SnakeBeta its own per-channel scale."""
    x = unit_last_stride(x)
    batch, channels, length = x.shape
    ctx = 0 if context is None else context.shape[-1]
    out = torch.empty(batch, channels, ctx + length, dtype=x.dtype, device=x.device)
    if out.numel():
        c = x if context is None else unit_last_stride(context)
        block, warps = _row_block(ctx + length)
        grid = (batch * channels, triton.cdiv(ctx + length, block))
        alpha, scale = alpha.reshape(-1).contiguous(), scale.reshape(-1).contiguous()
        _snake_kernel[grid](x, c, alpha, scale, bias if bias is not None else alpha, out, channels, length, ctx,
                            x.stride(0), x.stride(1), c.stride(0), c.stride(1), HAS_CTX=context is not None,
                            HAS_BIAS=bias is not None, BLOCK=block, num_warps=warps)
    return out


def add_residual(x: Tensor, y: Tensor, bias: Tensor | None) -> Tensor:
    """x + (y + bias) per channel: x, y [B, C, T] (any batch and channel strides), bias C values (a
    convolution's, not added to y before) -> contiguous, in x's dtype. Without a Triton GPU: torch."""
    if bias is None or not triton_ops.enabled(x):
        return x + (y if bias is None else y + bias[:, None])
    x, y = unit_last_stride(x), unit_last_stride(y)
    batch, channels, length = x.shape
    out = torch.empty(batch, channels, length, dtype=x.dtype, device=x.device)
    if out.numel():
        block, warps = _row_block(length)
        grid = (batch * channels, triton.cdiv(length, block))
        _add_residual_kernel[grid](x, y, bias, out, channels, length, x.stride(0), x.stride(1), y.stride(0),
                                   y.stride(1), BLOCK=block, num_warps=warps)
    return out


def conv1d_to_one(x: Tensor, weight: Tensor, bias: Tensor | None, dilation: int, padding: int) -> Tensor:
    """F.conv1d with one output channel and stride 1: x [B, C, T] (any batch and channel strides), weight
    [1, C, K], bias [1] or None -> [B, 1, T + 2 * padding - dilation * (K - 1)] (float32 accumulation)."""
    x = unit_last_stride(x)
    batch, channels, length = x.shape
    kernel = weight.shape[-1]
    length_out = length + 2 * padding - dilation * (kernel - 1)
    out = torch.empty(batch, 1, length_out, dtype=x.dtype, device=x.device)
    if out.numel():
        w = weight.reshape(channels, kernel).contiguous()
        grid = (batch, triton.cdiv(length_out, 128))
        _conv_to_one_kernel[grid](x, w, bias if bias is not None else w, out, channels, length, length_out,
                                  x.stride(0), x.stride(1), dilation, padding, K=kernel, HAS_BIAS=bias is not None,
                                  CB=32, BLOCK=128)
    return out


def depthwise_conv1d(x: Tensor, weight: Tensor, bias: Tensor | None, dilation: int, padding: int,
                     snake: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """F.conv1d with groups = channels and stride 1: x [B, C, T], weight [C, 1, K], bias [C] or None
    -> [B, C, T + 2 * padding - dilation * (K - 1)] in x's dtype (float32 accumulation). `snake` = (alpha,
    scale), C values each: the Snake after the convolution (`snake()`'s formula) applied before rounding."""
    x = x.contiguous()
    batch, channels, length = x.shape
    kernel = weight.shape[-1]
    length_out = length + 2 * padding - dilation * (kernel - 1)
    out = torch.empty(batch, channels, length_out, dtype=x.dtype, device=x.device)
    if out.numel():
        w = weight.reshape(channels, kernel).contiguous()
        b = bias.contiguous() if bias is not None else w
        alpha, scale = (t.reshape(-1).contiguous() for t in snake) if snake is not None else (w, w)
        block, warps = _row_block(length_out)
        grid = (batch * channels, triton.cdiv(length_out, block))
        _depthwise_conv1d_kernel[grid](x, w, b, alpha, scale, out, channels, length, length_out, DILATION=dilation,
                                       PADDING=padding, K=kernel, HAS_BIAS=bias is not None, SNAKE=snake is not None,
                                       BLOCK=block, num_warps=warps)
    return out


def folded_conv1d(x: Tensor, weight: Tensor, bias: Tensor | None, dilation: int, padding: int) -> Tensor:
    """F.conv1d(x, weight, bias, stride 1, padding, dilation) for groups = 1, computed undilated: output t
    reads inputs t, t + d, ..., all of phase t mod d, so the `d` phases of the (padded) input are convolved
    as `d` rows of one undilated convolution and interleaved back."""
    if padding:
        x = F.pad(x, (padding, padding))
    batch, channels, length = x.shape
    kernel, d = weight.shape[-1], dilation
    length_out = length - (kernel - 1) * d
    per_phase = -(-length // d)
    if per_phase * d != length:
        x = F.pad(x, (0, per_phase * d - length))
    phases = x.reshape(batch, channels, per_phase, d).permute(0, 3, 1, 2).reshape(batch * d, channels, per_phase)
    y = F.conv1d(phases, weight, bias)  # [batch * d, C_out, per_phase - kernel + 1]
    steps = y.shape[-1]
    y = y.reshape(batch, d, -1, steps).permute(0, 2, 3, 1).reshape(batch, -1, steps * d)
    return y[..., :length_out] if steps * d != length_out else y


def gemm_conv_transpose1d(x: Tensor, weight: Tensor, bias: Tensor | None, stride: int, padding: int,
                          output_padding: int = 0) -> Tensor:
    """F.conv_transpose1d(x, weight, bias, stride, padding, output_padding) for groups = 1 and dilation 1, as one
    batched GEMM and an overlap-add: input column i adds weight^T x[:, i] ([C_out, K]) at output columns
    i * stride - padding onwards. x [B, C_in, T], weight [C_in, C_out, K] -> [B, C_out, (T-1)s - 2p + K + op]."""
    batch, cin, length = x.shape
    _, cout, kernel = weight.shape
    cols = torch.matmul(weight.reshape(cin, cout * kernel).t(), x)  # [B, C_out * K, T]
    full = (length - 1) * stride + kernel  # every column an input reaches; the output drops `padding` on the
    out_len = full - 2 * padding + output_padding  # left and `padding - output_padding` on the right
    if output_padding == 0:
        out = F.fold(cols, output_size=(1, out_len), kernel_size=(1, kernel), stride=(1, stride),
                     padding=(0, padding)).view(batch, cout, out_len)
    else:
        out = F.fold(cols, output_size=(1, full), kernel_size=(1, kernel), stride=(1, stride)).view(batch, cout, full)
        out = F.pad(out, (0, max(padding + out_len - full, 0)))[..., padding : padding + out_len]
    return out if bias is None else out + bias[:, None]


# Which transposed convolutions `conv_transpose1d` runs as a GEMM on a GPU: launches of up to this many rows.
# Measured on an H100, SNAC's cropped Orpheus window in graph ms (benchmark/results/h100-2026-12-06), cuDNN /
# GEMM: 1 window 0.538 / 0.483; 16: 1.270 / 1.524; 64: 4.166 / 5.242; 256: 11.21 / 18.91.
TRANSPOSE_GEMM_ROWS = 1


def transpose_gemm(rows: int) -> bool:
    """Whether `conv_transpose1d` runs a launch of `rows` rows as a GEMM on a GPU (VOX_CODEC_TRANSPOSE_GEMM:
    0 never, 1 at any batch)."""
    switch = _switch("VOX_CODEC_TRANSPOSE_GEMM")
    return switch == "1" or (switch == "" and rows <= TRANSPOSE_GEMM_ROWS)


def conv_transpose1d(up: torch.nn.ConvTranspose1d, x: Tensor) -> Tensor:
    """`up(x)`; on a GPU, for the batches `transpose_gemm` names, as `gemm_conv_transpose1d` (groups 1,
    dilation 1, zero padding), where cuDNN's kernels for SNAC's shapes lose (one window: 0.483 ms against 0.538)."""
    plain = (up.groups == 1 and up.dilation == (1,) and up.padding_mode == "zeros" and isinstance(up.padding, tuple)
             and up.output_padding[0] < up.stride[0])
    if plain and triton_ops.enabled(x) and transpose_gemm(x.shape[0]):
        return gemm_conv_transpose1d(x, up.weight, up.bias, up.stride[0], up.padding[0], up.output_padding[0])
    return up(x)


_switches: dict[str, str] = {}  # the kernels' A/B switches, each read from the environment once


def _switch(name: str) -> str:
    """The A/B switch `name`: "" (unset: the default), "0" (off) or "1" (on)."""
    if name not in _switches:
        value = os.environ.get(name, "")
        if value not in ("", "0", "1"):
            raise ValueError(f"{name}={value!r}: use 0 (off) or 1 (on; unset: the default)")
        _switches[name] = value
    return _switches[name]


def fuses(conv: torch.nn.Conv1d | None, proj: torch.nn.Conv1d) -> bool:
    """Whether a residual unit (depthwise `conv`, then Snake, then the 1x1 `proj`) or, with conv None, a noise
    block (`proj` its 1x1 convolution) runs as `depthwise_conv1d(snake=...)` + `implicit_gemm.pointwise_conv1d`
    on a GPU: 4 passes over its activations instead of 7 (VOX_CODEC_FUSE=0: the unfused kernels, for A/B)."""
    if _switch("VOX_CODEC_FUSE") == "0" or proj.kernel_size != (1,) or proj.groups != 1 or proj.in_channels % 16:
        return False
    return conv is None or (conv.groups == conv.in_channels == conv.out_channels and conv.stride == (1,)
                            and isinstance(conv.padding, tuple) and conv.padding_mode == "zeros")


# Which dense convolutions `conv1d` runs as `conv_gemm` on a GPU: 1x1 ones (their epilogues save passes) and
# those of up to this many output channels. Measured on an H100, the Qwen3 codec's k=7 convolutions at 256
# windows (benchmark/results/h100-2026-12-06c), cuDNN (with its layout conversions) / conv_gemm in ms: 96
# channels 4.51 / 3.48, 192: 3.50 / 4.11 (a win once the fused Snake and residual add are counted), 384: 3.13 /
# 4.40, 768: 1.32 / 3.10, 1024 -> 1536: 0.49 / 1.32 (cuDNN's tensor-core kernels reach 500 TFLOP/s there).
GEMM_MAX_CHANNELS = 256
# The dilated convolutions that folding takes otherwise (FOLD_DILATION and up) go to conv_gemm up to this many
# outputs: the Qwen3 codec's 384-channel dilation-9 convolution at 256 windows, H100, folded 4.44 ms / conv_gemm
# 3.50 (h100-2026-12-06c); the codec launch 85.80 -> 84.97 ms at 256 windows, 22.38 -> 22.09 at 64
# (h100-2026-12-06d).
GEMM_MAX_DILATED_CHANNELS = 512


def gemm_convs(conv: torch.nn.Conv1d) -> bool:
    """Whether `conv1d` runs `conv` as `conv_gemm` on a GPU: groups 1, stride 1, zero padding, input channels
    in blocks of 16, more than one output channel, and 1x1 or up to GEMM_MAX_CHANNELS outputs (from FOLD_DILATION
    on, GEMM_MAX_DILATED_CHANNELS). VOX_CONV_GEMM=0: none, cuDNN's kernels and folding; =1: every such
    convolution; for A/B."""
    switch = _switch("VOX_CONV_GEMM")
    fits = (conv.groups == 1 and conv.stride == (1,) and conv.in_channels % 16 == 0 and conv.out_channels > 1
            and isinstance(conv.padding, tuple) and conv.padding_mode == "zeros")
    widest = GEMM_MAX_DILATED_CHANNELS if conv.dilation[0] >= FOLD_DILATION else GEMM_MAX_CHANNELS
    chosen = conv.kernel_size == (1,) or conv.out_channels <= widest
    return fits and switch != "0" and (chosen or switch == "1")


# Which dilated convolutions `conv1d` folds on a GPU. Measured on the H200, Qwen3-TTS codec launch in graph
# ms (benchmark/results/h200-2026-12-02c), folding none / dilation 9 / dilations 3 and 9:
# 1 window 2.14 / 2.18 / 2.20; 16: 10.28 / 8.85 / 7.33; 64: 27.99 / 22.54 / 23.43; 256: 105.5 / 85.2 / 88.6.
FOLD_DILATION = 9  # from this dilation on, always
FOLD_SMALL_DILATION, FOLD_SMALL_ROWS = 3, range(2, 17)  # from this one, for batches of 2-16 rows (measured at
# 16, a loss at 1 and 64; the batches between are not measured)
_fold: str | None = None  # VOX_CONV_FOLD, read once: "0" folds nothing, "<d>" every dilation >= d


def folds(dilation: int, rows: int) -> bool:
    """Whether `conv1d` folds a convolution of this dilation over a batch of `rows` on a GPU."""
    global _fold
    if _fold is None:
        _fold = os.environ.get("VOX_CONV_FOLD", "")
    if _fold:
        return 0 < int(_fold) <= dilation
    return dilation >= FOLD_DILATION or (dilation >= FOLD_SMALL_DILATION and rows in FOLD_SMALL_ROWS)


def conv1d(conv: torch.nn.Conv1d, x: Tensor, bias: bool = True) -> Tensor:
    """`conv(x)` (`bias=False`: without its bias, which a kernel after it adds); on a GPU, depthwise
    convolutions, those with one output channel and the dense ones `gemm_convs` takes (stride 1, zero padding)
    run the kernels above; with VOX_CONV_GEMM=0, convolutions of a large dilation are folded (`folded_conv1d`)."""
    b = conv.bias if bias else None
    plain = conv.stride == (1,) and isinstance(conv.padding, tuple) and conv.padding_mode == "zeros"
    if plain and triton_ops.enabled(x):
        if conv.groups == conv.in_channels == conv.out_channels:
            return depthwise_conv1d(x, conv.weight, b, conv.dilation[0], conv.padding[0])
        if conv.out_channels == 1 and conv.groups == 1:
            return conv1d_to_one(x, conv.weight, b, conv.dilation[0], conv.padding[0])
        if gemm_convs(conv):
            return conv_gemm(x, tap_weights(conv), b, conv.dilation[0], conv.padding[0])
        if conv.groups == 1 and conv.dilation[0] > 1 and folds(conv.dilation[0], x.shape[0]):
            return folded_conv1d(x, conv.weight, b, conv.dilation[0], conv.padding[0])
    return conv(x) if bias else conv._conv_forward(x, conv.weight, None)

"""Orpheus' step around its constrained draw, in PyTorch (the reference, and the CPU path) and in two Triton kernels.

A constrained decode step draws, per row, a candidate c over the row's slot window (4096 codes) plus the stop id
(candidate 4096). Around the draw:

- `constrain`: the repetition window mapped into candidate space (a code of the row's slot -> its candidate, the
  stop id -> 4096, anything else -> -1, so it is never penalised) and the stop candidate allowed only at a frame
  boundary when the row may stop;
- `emit`: the candidate back to a token id, and the token's code and out kind.

In PyTorch these are ~30 small kernels a step; the Triton forms are one each, with the same results: `constrain`
writes the mapped window and sets a disallowed stop candidate's logit to -inf in place, which the sampler treats
exactly as a False in the allowed mask (both give a logit of -inf before the penalty and the temperature, which
keep it there), so the draw needs no mask. On by default for CUDA tensors (`VOX_ORPHEUS_STEP_KERNELS=0` runs the
PyTorch forms): on an H200 (benchmark/results/h200-2026-12-03d) Orpheus-3B's captured decode step took 2.181 ->
2.086 ms at 1 row (297 -> 262 kernels) and 2.878 -> 2.827 ms at 16. Tests run the kernels through Triton's
interpreter (`forced`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from vox_serve.core.request import OutKind
from vox_serve.rt import pdl, triton_ops

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton: the PyTorch forms run
    triton = None

AUDIO_START = 128266
CODES_PER_SLOT = 4096
STOP_ID = 128258
ENV = "VOX_ORPHEUS_STEP_KERNELS"
forced: bool | None = None  # tests: True runs the kernels on any tensors (CPU ones through the interpreter)


def _on(t: Tensor) -> bool:
    return triton_ops.switched_on(t, forced, ENV, default_on=True)


def constrain_reference(history: Tensor, slot: Tensor, allow_stop: Tensor) -> tuple[Tensor, Tensor]:
    """(window in candidate space [n, W] int64, allowed [n, 4097] bool) for history [n, W] (-1 empty), slot [n]."""
    base = (AUDIO_START + CODES_PER_SLOT * slot).unsqueeze(1)
    local = history - base
    in_slot = (history >= 0) & (local >= 0) & (local < CODES_PER_SLOT)
    local = torch.where(history == STOP_ID, CODES_PER_SLOT, torch.where(in_slot, local, -1))
    allowed = torch.ones(history.shape[0], CODES_PER_SLOT + 1, dtype=torch.bool, device=history.device)
    allowed[:, CODES_PER_SLOT] = allow_stop & (slot == 0)
    return local, allowed


def emit_reference(cand: Tensor, slot: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(token [n], code [n] (0 unless audio), out kind [n]) of candidates [n] drawn at slots [n]."""
    token = torch.where(cand == CODES_PER_SLOT, STOP_ID, AUDIO_START + CODES_PER_SLOT * slot + cand)
    return (token, *code_and_kind(token, slot))


def code_and_kind(token: Tensor, slot: Tensor) -> tuple[Tensor, Tensor]:
    """A sampled token's code at its slot (0 unless it is one) and its out kind."""
    code = token - (AUDIO_START + CODES_PER_SLOT * slot)
    is_audio = (code >= 0) & (code < CODES_PER_SLOT)
    kind = torch.where(token == STOP_ID, int(OutKind.STOP), torch.where(is_audio, int(OutKind.AUDIO),
                                                                        int(OutKind.OTHER)))
    return torch.where(is_audio, code, 0), kind


def constrain(logits: Tensor, history: Tensor, slot: Tensor, allow_stop: Tensor) -> tuple[Tensor, Tensor | None]:
    """(window in candidate space [n, W], allowed mask for the draw): where the kernel runs, logits [n, 4097]
    float32's stop column is set to -inf in place where the stop is not allowed (what constrain_reference's mask
    does in the draw) and the mask is None; elsewhere constrain_reference's pair."""
    n, width = history.shape
    if not _on(logits) or logits.shape != (n, CODES_PER_SLOT + 1) or logits.stride(1) != 1:
        return constrain_reference(history, slot, allow_stop)
    history, slot, allow_stop = history.contiguous(), slot.contiguous(), allow_stop.contiguous()
    local = torch.empty(n, width, dtype=torch.int64, device=history.device)
    if n:
        _constrain_kernel[(n,)](logits, history, slot, allow_stop, local, logits.stride(0), W=width,
                                W_BLOCK=triton.next_power_of_2(max(width, 1)), AUDIO_START=AUDIO_START,
                                CODES=CODES_PER_SLOT, STOP=STOP_ID, num_warps=1, **pdl.launch_options(logits))
    return local, None


def emit(cand: Tensor, slot: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """emit_reference, in one kernel where it runs."""
    if not _on(cand):
        return emit_reference(cand, slot)
    cand, slot = cand.contiguous(), slot.contiguous()
    n = cand.shape[0]
    token, code, kind = (torch.empty(n, dtype=torch.int64, device=cand.device) for _ in range(3))
    if n:
        block = 256
        _emit_kernel[(triton.cdiv(n, block),)](cand, slot, token, code, kind, n, AUDIO_START=AUDIO_START,
                                               CODES=CODES_PER_SLOT, STOP=STOP_ID, STOP_KIND=int(OutKind.STOP),
                                               AUDIO=int(OutKind.AUDIO), OTHER=int(OutKind.OTHER), BLOCK=block,
                                               **pdl.launch_options(cand))
    return token, code, kind


if triton is not None:

    @triton.jit(do_not_specialize=["row_stride"])
    def _constrain_kernel(logits, history, slot_ptr, allow_stop, local_out, row_stride, W: tl.constexpr,
                          W_BLOCK: tl.constexpr, AUDIO_START: tl.constexpr, CODES: tl.constexpr, STOP: tl.constexpr,
                          PDL: tl.constexpr):
        pdl.enter(PDL)
        i = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_ptr + i).to(tl.int64)
        base = AUDIO_START + CODES * slot
        if W > 0:
            w = tl.arange(0, W_BLOCK)
            mask = w < W
            hist = tl.load(history + i * W + w, mask=mask, other=-1).to(tl.int64)
            local = hist - base
            in_slot = (hist >= 0) & (local >= 0) & (local < CODES)
            local = tl.where(hist == STOP, CODES, tl.where(in_slot, local, -1))
            tl.store(local_out + i * W + w, local, mask=mask)
        stop_ok = (tl.load(allow_stop + i) != 0) & (slot == 0)
        stop_at = logits + i * row_stride + CODES
        tl.store(stop_at, tl.where(stop_ok, tl.load(stop_at), float("-inf")))

    @triton.jit(do_not_specialize=["n"])
    def _emit_kernel(cand_ptr, slot_ptr, token_out, code_out, kind_out, n, AUDIO_START: tl.constexpr,
                     CODES: tl.constexpr, STOP: tl.constexpr, STOP_KIND: tl.constexpr, AUDIO: tl.constexpr,
                     OTHER: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        pdl.enter(PDL)
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        cand = tl.load(cand_ptr + i, mask=mask, other=0).to(tl.int64)
        base = AUDIO_START + CODES * tl.load(slot_ptr + i, mask=mask, other=0).to(tl.int64)
        token = tl.where(cand == CODES, STOP, base + cand)
        code = token - base
        is_audio = (code >= 0) & (code < CODES)
        kind = tl.where(token == STOP, STOP_KIND, tl.where(is_audio, AUDIO, OTHER))
        tl.store(token_out + i, token, mask=mask)
        tl.store(code_out + i, tl.where(is_audio, code, 0), mask=mask)
        tl.store(kind_out + i, kind.to(tl.int64), mask=mask)

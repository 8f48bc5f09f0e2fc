"""The device view of one codec launch: each row's window of frames gathered from its slot's codes.

A codec row names (slot, first frame, window end); the stage gathers `window` frames starting at
the first frame, with the window rules of `core/chunks.py` applied on the device: a frame before 0
repeats frame 0 (no lookback exists yet), a frame at or past the window end repeats the last one
(a short final chunk).

In a disaggregated engine (`EngineHalf`) the LM half gathers the windows' codes and latents into its
hand-over arena (`hand_over`), one copy moves them to the codec device, and the codec half builds the
same windows from its copy (`handed_over`): the codec stages read nothing else the LM made.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vox_serve.rt.arena import Arena
from vox_serve.rt.slot_state import SlotState


@dataclass
class CodecWindow:
    codes: Tensor  # [K, window, codes_per_frame] int64
    first_frame: Tensor  # [K] int64: absolute index of the window's first frame (noise and state offsets)
    seed: Tensor  # [K] int64: the request's sampling seed
    slot: Tensor  # [K] int64 table rows (the scratch row for padding): the codec state's slot
    latents: Tensor | None  # [K, window, frame_latent_dim] float32, when the program declares them
    pcm_out: Tensor  # [K, samples] int16 view of step_out
    # [K] int64: one past the last frame the window may read (positions at or past it repeat the last
    # frame): a codec that pads at the sequence ends (DAC) masks the window's frames outside
    # [0, window_end) instead of reading the repeats
    window_end: Tensor | None = None


def frame_index(first_frame: Tensor, window_end: Tensor, window: int) -> Tensor:
    """[K, window] the frame each window position reads."""
    f = first_frame[:, None] + torch.arange(window, device=first_frame.device)
    return torch.minimum(f.clamp(min=0), window_end.clamp(min=1)[:, None] - 1)


@dataclass
class WindowInputs:
    """What a codec launch's rows read from the LM's output: codes [K, window, codes_per_frame] int64 and,
    when the program declares them, latents [K, window, frame_latent_dim] float32."""

    codes: Tensor
    latents: Tensor | None


def _rows(state: SlotState, step_in: Arena, prefix: str, batch: int) -> tuple[Tensor, Tensor, Tensor]:
    """(table row, first frame, window end) of each of the launch's rows, [K] int64 each."""
    a = step_in.dev
    slot = state.slots(a[f"{prefix}_slot"][:batch])
    return slot, a[f"{prefix}_first_frame"][:batch].long(), a[f"{prefix}_window_end"][:batch].long()


def gather_window_inputs(state: SlotState, step_in: Arena, prefix: str, batch: int, window: int) -> WindowInputs:
    """The windows of the launch's rows, gathered from their slots' codes (and latents)."""
    return _gather(state, *_rows(state, step_in, prefix, batch), window)


def _gather(state: SlotState, slot: Tensor, first: Tensor, end: Tensor, window: int) -> WindowInputs:
    frames = frame_index(first, end, window)
    cpf = state.codes_per_frame
    index = frames[:, :, None] * cpf + torch.arange(cpf, device=slot.device)
    codes = state.codes[slot[:, None, None], index.clamp(max=state.max_codes - 1)].long()
    latents = state.latents[slot[:, None], frames] if state.latents is not None else None
    return WindowInputs(codes, latents)


def codec_window(state: SlotState, step_in: Arena, step_out: Arena, prefix: str, batch: int, window: int,
                 inputs: WindowInputs | None = None) -> CodecWindow:
    """The launch's windows; `inputs` when they were gathered elsewhere (a disaggregated engine's LM half),
    else gathered here from the slots."""
    slot, first, end = _rows(state, step_in, prefix, batch)
    if inputs is None:
        inputs = _gather(state, slot, first, end, window)
    return CodecWindow(codes=inputs.codes, first_frame=first, seed=state["seed"][slot], slot=slot,
                       latents=inputs.latents, pcm_out=step_out.dev[f"{prefix}_pcm"], window_end=end)


def hand_over(handover: Arena, prefix: str, inputs: WindowInputs) -> None:
    """The LM half: write a launch's window inputs into its hand-over arena (rows 0..K-1)."""
    batch = inputs.codes.shape[0]
    handover[f"{prefix}_codes"][:batch] = inputs.codes
    if inputs.latents is not None:
        handover[f"{prefix}_latents"][:batch] = inputs.latents


def handed_over(handover: Arena, prefix: str, batch: int) -> WindowInputs:
    """The codec half: the window inputs of a launch's rows, as copied into its hand-over arena."""
    latents = f"{prefix}_latents"
    return WindowInputs(handover[f"{prefix}_codes"][:batch].long(),
                        handover[latents][:batch] if latents in handover else None)

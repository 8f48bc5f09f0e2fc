"""The device view of one codec launch: each row's window of frames gathered from its slot's codes.

A codec row names (slot, first frame, window end); the stage gathers `window` frames starting at
the first frame, with the window rules of `core/chunks.py` applied on the device: a frame before 0
repeats frame 0 (no lookback exists yet), a frame at or past the window end repeats the last one
(a short final chunk).
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


def codec_window(state: SlotState, step_in: Arena, step_out: Arena, prefix: str, batch: int,
                 window: int) -> CodecWindow:
    a = step_in.dev
    slot = state.slots(a[f"{prefix}_slot"][:batch])
    first, end = a[f"{prefix}_first_frame"][:batch].long(), a[f"{prefix}_window_end"][:batch].long()
    frames = frame_index(first, end, window)
    cpf = state.codes_per_frame
    index = frames[:, :, None] * cpf + torch.arange(cpf, device=slot.device)
    codes = state.codes[slot[:, None, None], index.clamp(max=state.max_codes - 1)].long()
    latents = state.latents[slot[:, None], frames] if state.latents is not None else None
    return CodecWindow(codes=codes, first_frame=first, seed=state["seed"][slot], slot=slot, latents=latents,
                       pcm_out=step_out.dev[f"{prefix}_pcm"], window_end=end)

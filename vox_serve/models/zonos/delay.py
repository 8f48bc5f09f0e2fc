"""The delay pattern across the 9 codebooks, the reference's column writes and its stop rule.

The LM reads and writes *columns* of delayed codes: column t holds codebook k's code of frame t - k - 1
(`delayed[k, t] = codes[k, t - k - 1]`, the mask token where that frame does not exist), so column 0 is
all mask and frame f is complete once column f + 9 is written. A request with P prefix frames (audio to
continue) and at most M new frames has A = P + M frames; prefill reads columns 0..P, the prefill step
writes column P + 1 and every decode step the next one.

Writes follow the reference's `masked_scatter_`: a column's not-yet-known entries (codebook k with
P <= t - k - 1 < A) take the step's tokens *in order*. Inside the sequence that is token k for codebook
k; in the last 8 columns (t > A) the low codebooks are already mask, so codebook k takes head
k - (t - A)'s token: the reference's quirk when it runs out of frames, kept for equal output.

Stop rule (decode steps only): EOS sampled in codebook 0 cuts the remaining steps to at most 9 and starts
a diagonal: while stopping, codebooks below `9 - remaining` are forced to mask and that one to EOS.
The row is done when its remaining steps reach 0; its frames are those before the EOS frame.
Functions here work on [N] rows with fixed shapes (capturable); the host needs none of their values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vox_serve.models.zonos.config import CODEBOOK_SIZE, EOS_ID, MASK_ID, NUM_CODEBOOKS

UNKNOWN = -1  # a delayed entry not generated yet
STOP_DIAGONAL_STEPS = NUM_CODEBOOKS  # steps from the EOS column to the end of the diagonal, both included


def delay(codes: Tensor) -> Tensor:
    """codes [B, 9, T] -> delayed [B, 9, T + 9] (entries with no frame are the mask token)."""
    b, k, t = codes.shape
    out = torch.full((b, k, t + k), MASK_ID, dtype=codes.dtype, device=codes.device)
    for cb in range(k):
        out[:, cb, cb + 1 : cb + 1 + t] = codes[:, cb]
    return out


def undelay(delayed: Tensor) -> Tensor:
    """delayed [B, 9, T + 9] -> codes [B, 9, T]."""
    b, k, total = delayed.shape
    return torch.stack([delayed[:, cb, cb + 1 : total - k + cb + 1] for cb in range(k)], dim=1)


def unknown_entries(column: Tensor, prefix_frames: Tensor, num_frames: Tensor) -> Tensor:
    """Which entries of column t a step fills: [N] columns, prefix lengths P, frame counts A -> [N, 9] bool."""
    frame = column[:, None] - 1 - torch.arange(NUM_CODEBOOKS, device=column.device)
    return (frame >= prefix_frames[:, None]) & (frame < num_frames[:, None])


def write_column(tokens: Tensor, known: Tensor, unknown: Tensor) -> Tensor:
    """tokens [N, 9], known [N, 9] (the column as pre-filled: mask or prefix codes), unknown [N, 9] bool ->
    the written column: the i-th unknown entry of a row takes tokens[i] (masked_scatter order)."""
    rank = (torch.cumsum(unknown.long(), dim=1) - 1).clamp(min=0)
    return torch.where(unknown, tokens.gather(1, rank), known)


def stop_rule(tokens: Tensor, remaining: Tensor, stopping: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One decode step of the stop rule. tokens [N, 9] as sampled, remaining [N] int64 steps left
    (before this one), stopping [N] bool -> (tokens with the diagonal forced, remaining - 1, stopping)."""
    eos = tokens[:, 0] == EOS_ID
    remaining = torch.where(eos, remaining.clamp(max=STOP_DIAGONAL_STEPS), remaining)
    stopping = stopping | eos
    diagonal = (NUM_CODEBOOKS - remaining).clamp(max=NUM_CODEBOOKS - 1)[:, None]
    k = torch.arange(NUM_CODEBOOKS, device=tokens.device)[None]
    forced = torch.where(k < diagonal, MASK_ID, torch.where(k == diagonal, EOS_ID, tokens))
    return torch.where(stopping[:, None], forced, tokens), remaining - 1, stopping


def decode_steps(max_new_frames: int) -> int:
    """Decode steps after the prefill step when no EOS comes, as the reference counts them: the frames
    plus 8. The last one writes column A + 9, which does not exist, so its tokens are dropped."""
    return max_new_frames + NUM_CODEBOOKS - 1


def output_frames(delayed: Tensor, last_column: int) -> Tensor:
    """The reference's result: `last_column - 9` frames (the column of the last step: EOS column + 8, or
    A + 9 when the frames ran out), i.e. the frames before the EOS frame; codes >= 1024 (EOS, mask) as 0.
    delayed [B, 9, A + 9] -> [B, 9, last_column - 9]."""
    codes = undelay(delayed)[..., : last_column - NUM_CODEBOOKS]
    return codes.masked_fill(codes >= CODEBOOK_SIZE, 0)

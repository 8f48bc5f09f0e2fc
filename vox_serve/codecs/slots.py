"""Streaming state of a causal codec decoder for many requests, in preallocated pools indexed by a codec slot.

A streaming decoder (`vox_serve.codecs.streaming.StreamingCodecDecoder`) names its per-request state
entries (`state_names`, `state_shapes`) and decodes a chunk through a list of batch-first state tensors
and the chunk's first frame index (`forward_chunk`). `CodecSlots` keeps those states for up to
`num_slots` requests, flattened into one tensor, so that one captured codec graph per (batch, frames)
serves any set of requests.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vox_serve.codecs.streaming import StreamingCodecDecoder


class CodecSlots:
    """Pools: ``state`` [num_slots, state_numel] in the decoder's dtype, the concatenation of every state
    entry (names and shapes in ``layout()``), and ``pos`` [num_slots] int64, the next frame's index.

    ``decode_chunk`` reads and writes only the slots it is given, with static shapes and no host
    synchronisation.
    """

    def __init__(self, decoder: StreamingCodecDecoder, num_slots: int):
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
        """codes [B, N, Q] (the next N frames of each request), slots [B] int64 (distinct) -> pcm
        [B, N * samples per frame]."""
        states, pos = self._states(slots), self.pos.index_select(0, slots)
        pcm = self.decoder.forward_chunk(codes, states, pos)
        self._store(slots, states, pos + codes.shape[1])
        return pcm

    @torch.no_grad()
    def prime_slots(self, slots: Tensor, codes: Tensor, lengths: Tensor) -> None:
        """Fresh ``slots`` [K] int64 -> their state after decoding frames codes[k, :lengths[k]] of codes
        [K, F, Q] (a prefix whose audio is never formed; length 0 leaves a slot fresh). The decoder must
        provide ``prime(codes, lengths, states)``. Static shapes, no host synchronisation."""
        states = self._states(slots)
        self.decoder.prime(codes, lengths, states)
        self._store(slots, states, lengths.to(self.pos.dtype))

    def _states(self, slots: Tensor) -> list[Tensor]:
        flat = self.state.index_select(0, slots)
        return [part.unflatten(1, s) for part, s in zip(flat.split(self.sizes, dim=1), self.shapes, strict=True)]

    def _store(self, slots: Tensor, states: list[Tensor], pos: Tensor) -> None:
        self.state.index_copy_(0, slots, torch.cat([s.reshape(slots.shape[0], -1) for s in states], dim=1))
        self.pos.index_copy_(0, slots, pos)

    def reset_slots(self, slots: Tensor) -> None:
        """Make ``slots`` [K] int64 fresh (graph-safe)."""
        self.state.index_fill_(0, slots, 0)
        self.pos.index_fill_(0, slots, 0)

    def reset_slot(self, slot: int) -> None:
        self.state[slot].zero_()
        self.pos[slot] = 0

    def memory_bytes(self) -> int:
        return self.state.numel() * self.state.element_size() + self.pos.numel() * self.pos.element_size()

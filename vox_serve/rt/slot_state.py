"""Request state on the device, indexed by request slot: written when it changes, read by the stages.

Row `s` of every table belongs to the request in slot `s` (`core/slot_table.py` is the host's
mirror of the counters); the extra last row is the scratch slot, which padded rows and rows that do
not sample read and write, so no request's state is ever touched by padding. Tables:

- `page_table` [S + 1, kv_streams * max_pages_per_seq] int32: KV pages in sequence order, stream j's
  in columns j * max_pages_per_seq .. (the scratch row stays the null page);
- sampling parameters per slot (temperature, top_k, top_p, min_p, repetition_penalty,
  repetition_window, seed, allow_stop) and `prompt_len`, set at admission;
- `tokens` [S + 1, max_model_len, codes_per_step] int32: the history of sampled token rows, row g =
  generated token g, written by the LM stages; generated positions' inputs and the repetition window
  are read from it;
- `codes` [S + 1, max_model_len * codes_per_step] int32 and `num_codes` [S + 1] int64: the audio
  codes so far, appended by the LM stages, read by codec windows;
- `latents` [S + 1, max_frames, frame_latent_dim] float32 when the program declares frame latents;
- one tensor per program-declared slot field (`ProgramLayout.slot_fields`) [S + 1, *shape], with
  `<name>_len` [S + 1] int64 holding the length of the value set at admission.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vox_serve.core.meta import EngineLimits, ProgramMeta

SAMPLING_FIELDS = {  # name -> dtype of the per-slot sampling tables
    "temperature": torch.float32, "top_k": torch.int64, "top_p": torch.float32, "min_p": torch.float32,
    "repetition_penalty": torch.float32, "repetition_window": torch.int64, "seed": torch.int64,
    "allow_stop": torch.bool, "prompt_len": torch.int64,
}


def slot_field_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "int32": torch.int32, "int64": torch.int64}[name]


class SlotState:
    def __init__(self, meta: ProgramMeta, limits: EngineLimits, device: torch.device) -> None:
        self.num_slots = limits.slots
        self.scratch = limits.slots  # padded rows' slot
        rows = limits.slots + 1
        self.max_generated = limits.max_model_len
        self.codes_per_frame = meta.codes_per_frame
        self.max_codes = limits.max_model_len * meta.codes_per_step
        self.max_frames = -(-self.max_codes // meta.codes_per_frame)
        self.tables: dict[str, Tensor] = {}
        self.kv_streams = limits.kv_streams
        self.pages_per_stream = limits.max_pages_per_seq
        width = limits.kv_streams * limits.max_pages_per_seq
        self.page_table = self._alloc("page_table", (rows, width), torch.int32, device)
        for name, dtype in SAMPLING_FIELDS.items():
            self._alloc(name, (rows,), dtype, device)
        self.tokens = self._alloc("tokens", (rows, self.max_generated, meta.codes_per_step), torch.int32, device)
        self.codes = self._alloc("codes", (rows, self.max_codes), torch.int32, device)
        self.num_codes = self._alloc("num_codes", (rows,), torch.int64, device)
        dim = meta.layout.frame_latent_dim
        self.latents = self._alloc("latents", (rows, self.max_frames, dim), torch.float32, device) if dim else None
        for f in meta.layout.slot_fields:
            self._alloc(f.name, (rows, *f.shape), slot_field_dtype(f.dtype), device)
            self._alloc(f"{f.name}_len", (rows,), torch.int64, device)

    def _alloc(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        t = torch.zeros(shape, dtype=dtype, device=device)
        self.tables[name] = t
        return t

    def __getitem__(self, name: str) -> Tensor:
        return self.tables[name]

    def slots(self, slot: Tensor) -> Tensor:
        """Host slot ids (NO_SLOT = -1 for padding) -> table rows (the scratch row for padding)."""
        return torch.where(slot >= 0, slot, self.scratch).long()

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tables.values())

    def layout(self) -> dict:
        """Addresses, shapes and dtypes of every table (the engine spec's `slot_state`)."""
        return {"num_slots": self.num_slots, "scratch_slot": self.scratch,
                "tables": {name: {"ptr": t.data_ptr(), "shape": list(t.shape),
                                  "dtype": str(t.dtype).removeprefix("torch."), "nbytes": t.numel() * t.element_size()}
                           for name, t in self.tables.items()}}

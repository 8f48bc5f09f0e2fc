"""The device view of one LM launch, derived inside the stage from a few scalars per row.

The host gives per row a slot, a position (and for prefill the token count, the kv length and the
sample flag) and per token the ids it knows. Everything else comes from the slot tables on the
device (`SlotState`), inside the captured graph: generated positions' ids from the token history,
KV write slots and page rows from the page table, sampling parameters and the repetition window,
the RNG offset (the index of the token being sampled), and the codes so far. `commit` writes the
row's sampled token into the history, appends its codes, and stores its out kind for the host.
Rows that do not sample (padding, a non-final prefill chunk) write only into the scratch slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vox_serve.core.plan import ABSENT_ID
from vox_serve.core.request import OutKind
from vox_serve.rt.arena import Arena
from vox_serve.rt.attention import AttentionBuffers
from vox_serve.rt.kernels import SamplingTensors
from vox_serve.rt.slot_state import SlotState


@dataclass
class LmSample:
    """What a program's LM step returns for its rows: token rows [n, codes_per_step] (what the history
    keeps and later inputs read), audio codes [n, codes_per_step] (appended when the kind is AUDIO),
    out kinds [n], and optionally a float latent per row [n, frame_latent_dim] (kept per frame)."""

    tokens: Tensor
    codes: Tensor
    kind: Tensor
    latents: Tensor | None = None


@dataclass
class LmBatch:
    """Views of one LM launch of `num_tokens` tokens and `num_seqs` rows (bucket sizes)."""

    state: SlotState
    num_tokens: int
    num_seqs: int
    ids: Tensor  # [T, input_columns] int64, ABSENT_ID where nothing is given
    positions: Tensor  # [T] int64
    attention: AttentionBuffers
    slot: Tensor  # [n] int64 table rows (scratch for padding)
    write_slot: Tensor  # [n] int64: slot for sampling rows, scratch otherwise
    gen_index: Tensor  # [n] int64: index of the token the row samples (its RNG offset)
    num_codes: Tensor  # [n] int64: audio codes before this row's
    logits_index: Tensor  # [n] int64: the token whose hidden state the row samples from
    sampling: SamplingTensors
    history: Tensor  # [n, repetition_window] int64: the row's recent first-column tokens (-1 empty)
    allow_stop: Tensor  # [n] bool
    kind_out: Tensor  # [n] int32 view of step_out
    # prefill with declared prompt vectors: (token index [E], vectors [E, dim]) to add to those tokens'
    # input embeddings; padded entries add zeros to token 0
    prompt_vectors: tuple[Tensor, Tensor] | None = None

    def commit(self, sample: LmSample) -> None:
        """Write the rows' samples into the slot tables and their kinds into the step's outputs."""
        st, n, ws = self.state, self.num_seqs, self.write_slot
        gen = self.gen_index.clamp(0, st.max_generated - 1)
        st.tokens[ws, gen] = sample.tokens.to(torch.int32)
        audio = (sample.kind == int(OutKind.AUDIO)) | (sample.kind == int(OutKind.AUDIO_STOP))
        wa = torch.where(audio, ws, st.scratch)
        cps = sample.codes.shape[1]
        index = (self.num_codes[:, None] + torch.arange(cps, device=ws.device)).clamp(max=st.max_codes - 1)
        st.codes[wa[:, None], index] = sample.codes.to(torch.int32)
        if st.latents is not None and sample.latents is not None:
            frame = (self.num_codes // st.codes_per_frame).clamp(max=st.max_frames - 1)
            st.latents[wa, frame] = sample.latents.float()
        st.num_codes.index_add_(0, wa, audio.long() * cps)
        self.kind_out[:n] = sample.kind.to(torch.int32)


def _resolve_ids(st: SlotState, host_ids: Tensor, tok_slot: Tensor, positions: Tensor) -> Tensor:
    """Host ids [T, C] with ABSENT_ID in a code column of a generated position replaced by the slot's
    history entry there."""
    ids = host_ids.long()
    cps = st.tokens.shape[2]
    gen_row = positions - st["prompt_len"][tok_slot]
    hist = st.tokens[tok_slot, gen_row.clamp(0, st.max_generated - 1)].long()  # [T, cps]
    head = ids[:, :cps]
    fill = (head == ABSENT_ID) & (gen_row >= 0)[:, None]
    return torch.cat([torch.where(fill, hist, head), ids[:, cps:]], dim=1)


def _history(st: SlotState, slot: Tensor, gen_index: Tensor, width: int) -> Tensor:
    """[n, width] the first-column tokens of the rows' last `repetition_window` generated tokens."""
    if width == 0:
        return torch.full((slot.shape[0], 0), -1, dtype=torch.int64, device=slot.device)
    col = torch.arange(width, device=slot.device)
    index = gen_index[:, None] - width + col
    window = st["repetition_window"][slot].clamp(max=width)
    valid = (index >= 0) & (col[None, :] >= width - window[:, None])
    tokens = st.tokens[slot[:, None], index.clamp(min=0), 0].long()
    return torch.where(valid, tokens, -1)


def _kv_indices(page_rows: Tensor, kv_indptr: Tensor, out: Tensor) -> None:
    """Fill `out` with the used pages of every row in order (the CSR indices host planners pair with
    `kv_indptr`), with static shapes: entry e belongs to the row whose indptr range holds it."""
    n, width = page_rows.shape
    e = torch.arange(n * width, device=page_rows.device)
    ends = kv_indptr[1 : n + 1].long()
    row = torch.searchsorted(ends, e, right=True).clamp(max=n - 1)
    col = (e - kv_indptr[:n].long()[row]).clamp(0, width - 1)
    out[: n * width] = torch.where(e < ends[-1], page_rows[row, col], 0).to(out.dtype)


@dataclass
class LaunchSource:
    """Where one LM stage reads: the step arenas, the slot tables and the stage's CSR index buffer."""

    state: SlotState
    step_in: Arena
    step_out: Arena
    page_size: int
    repetition_window: int
    kv_indices: Tensor | None  # filled in the stage for planners that need it (FlashInfer)


def decode_batch(src: LaunchSource, n: int) -> LmBatch:
    """The decode launch of `n` rows (one token each)."""
    st, a = src.state, src.step_in.dev
    slot = st.slots(a["decode_slot"][:n])
    pos = a["decode_pos"][:n].long()
    kv_len = (pos + 1).to(torch.int32)
    qo_indptr = torch.arange(n + 1, dtype=torch.int32, device=pos.device)
    gen_index = pos + 1 - st["prompt_len"][slot]
    return _batch(src, "decode", n, n, slot, slot, pos, a["decode_ids"][:n], kv_len, qo_indptr,
                  torch.ones(n, dtype=torch.bool, device=pos.device), gen_index, torch.arange(n, device=pos.device))


def prefill_batch(src: LaunchSource, num_tokens: int, num_seqs: int) -> LmBatch:
    """The prefill launch of `num_tokens` token rows in `num_seqs` sequences."""
    st, a = src.state, src.step_in.dev
    slot = st.slots(a["prefill_slot"][:num_seqs])
    tok_slot = st.slots(a["prefill_tok_slot"][:num_tokens])
    pos = a["prefill_pos"][:num_tokens].long()
    kv_len = a["prefill_kv_len"][:num_seqs]
    qo_indptr = a["prefill_qo_indptr"][: num_seqs + 1]
    gen_index = kv_len.long() - st["prompt_len"][slot]
    logits_index = (qo_indptr[1:].long() - 1).clamp(min=0)
    batch = _batch(src, "prefill", num_tokens, num_seqs, slot, tok_slot, pos, a["prefill_ids"][:num_tokens], kv_len,
                   qo_indptr, a["prefill_sample"][:num_seqs], gen_index, logits_index)
    if "prefill_vec_token" in a:
        token = a["prefill_vec_token"].long()
        valid = (token >= 0) & (token < num_tokens)
        batch.prompt_vectors = (torch.where(valid, token, 0), torch.where(valid[:, None], a["prefill_vec"], 0.0))
    return batch


def _batch(src: LaunchSource, stage: str, num_tokens: int, n: int, slot: Tensor, tok_slot: Tensor, pos: Tensor,
           host_ids: Tensor, kv_len: Tensor, qo_indptr: Tensor, sample: Tensor, gen_index: Tensor,
           logits_index: Tensor) -> LmBatch:
    st, a, h = src.state, src.step_in.dev, src.step_in.host
    ps = src.page_size
    page = st.page_table[tok_slot, (pos // ps).clamp(max=st.page_table.shape[1] - 1)].long()
    page_rows = st.page_table[slot]
    kv_indptr = a[f"{stage}_kv_indptr"][: n + 1]
    if src.kv_indices is not None:
        _kv_indices(page_rows, kv_indptr, src.kv_indices)
    attention = AttentionBuffers(
        page_table=page_rows, kv_lens=kv_len, qo_indptr=qo_indptr, slot_mapping=page * ps + pos % ps,
        kv_indices=src.kv_indices, kv_indptr_host=h[f"{stage}_kv_indptr"], qo_indptr_host=h.get(f"{stage}_qo_indptr"),
        kv_last_page_len_host=h[f"{stage}_last_page_len"],
    )
    write_slot = torch.where(sample, slot, st.scratch)
    sampling = SamplingTensors(
        temperature=st["temperature"][slot], top_k=st["top_k"][slot], top_p=st["top_p"][slot],
        min_p=st["min_p"][slot], repetition_penalty=st["repetition_penalty"][slot], seed=st["seed"][slot],
        offset=gen_index,
    )
    return LmBatch(
        state=st, num_tokens=num_tokens, num_seqs=n, ids=_resolve_ids(st, host_ids, tok_slot, pos), positions=pos,
        attention=attention, slot=slot, write_slot=write_slot, gen_index=gen_index, num_codes=st.num_codes[slot],
        logits_index=logits_index, sampling=sampling, history=_history(st, slot, gen_index, src.repetition_window),
        allow_stop=st["allow_stop"][slot], kind_out=src.step_out.dev[f"{stage}_kind"],
    )

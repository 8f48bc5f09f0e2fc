"""The device view of one LM launch, derived inside the stage from a few scalars per row.

The host gives per row a slot, a position (and for prefill the token count, the kv length and the
sample flag) and per token the ids it knows. Everything else comes from the slot tables on the
device (`SlotState`), inside the captured graph: generated positions' ids from the token history,
KV write slots and page rows from the page table, sampling parameters and the repetition window,
the RNG offset (the index of the token being sampled), and the codes so far. `commit` writes the
row's sampled token into the history, appends its codes, and stores its out kind for the host.
Rows that do not sample (padding, a non-final prefill chunk) write only into the scratch slot.
On GPUs the decode launch's derivation and every commit run as one Triton kernel each (`rt/launch_rows.py`);
the PyTorch code here is their reference.

Paired rows (`ProgramLayout.kv_streams` = K > 1, classifier-free guidance): each row attends K KV
sequences of the same length, one per stream. The launch's tokens are expanded stream by stream:
with T the launch's real tokens (decode: its rows), attention token `j * T + t` is stream j's copy of
token t (same ids and position; stream j's part of a prompt vector), tokens past K * T are padding,
and attention sequence `j * R + i` is stream j of row i (R: the launch's rows), reading columns
`j * max_pages_per_seq ..` of the slot's page-table row. `logits_index` then lists the K tokens each
row samples from, stream by stream; the program mixes them into one sample per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vox_serve.core.plan import ABSENT_ID
from vox_serve.core.request import OutKind
from vox_serve.rt import launch_rows
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
    """Views of one LM launch of `num_tokens` attention tokens and `num_seqs` rows (bucket sizes; with
    kv_streams K > 1, `num_tokens` is K times the bucket's token rows: see the module docstring)."""

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
    logits_index: Tensor  # [K * n] int64: the token whose hidden state row i samples from, stream j at j * n + i
    sampling: SamplingTensors
    history: Tensor  # [n, repetition_window] int64: the row's recent first-column tokens (-1 empty)
    allow_stop: Tensor  # [n] bool
    kind_out: Tensor  # [n] int32 view of step_out
    # prefill with declared prompt vectors: (token index [K * E], vectors [K * E, dim]) to add to those
    # tokens' input embeddings; padded entries add zeros to token 0
    prompt_vectors: tuple[Tensor, Tensor] | None = None
    kv_streams: int = 1

    def commit(self, sample: LmSample) -> None:
        """Write the rows' samples into the slot tables and their kinds into the step's outputs."""
        if launch_rows.commit(self, sample):
            return
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
    fused = launch_rows.decode_rows(src, n)
    if fused is not None:
        return _assemble(src, "decode", fused, write_slot=fused.slot, num_tokens=n)
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
        token, vectors = torch.where(valid, token, 0), torch.where(valid[:, None], a["prefill_vec"], 0.0)
        k = st.kv_streams
        if k > 1:  # stream j's part of each vector goes to stream j's copy of its token
            shift = qo_indptr[num_seqs].long() * torch.arange(k, device=token.device)[:, None]
            token = torch.where(valid, token + shift, 0).reshape(-1)
            vectors = vectors.view(len(valid), k, -1).transpose(0, 1).reshape(k * len(valid), -1)
        batch.prompt_vectors = (token, vectors)
    return batch


@dataclass
class _Streams:
    """The stream-by-stream expansion of a launch's tokens and rows (paired rows, K = kv_streams)."""

    k: int
    real_tokens: Tensor  # [] int64: T, the launch's real tokens (qo_indptr[n])
    source: Tensor  # [K * num_tokens] int64: the launch token each attention token copies
    stream: Tensor  # [K * num_tokens] int64

    @classmethod
    def of(cls, k: int, num_tokens: int, qo_indptr: Tensor, n: int) -> _Streams:
        t = qo_indptr[n].long().clamp(min=1)
        e = torch.arange(k * num_tokens, device=qo_indptr.device)
        real = e < k * t
        stream = torch.where(real, e // t, 0)
        source = torch.where(real, e - stream * t, (e - (k - 1) * t).clamp(max=num_tokens - 1))
        return cls(k, t, source, stream)

    def rows(self, x: Tensor) -> Tensor:
        """[n, ...] per-row values -> [K * n, ...], stream by stream."""
        return x.repeat(self.k, *([1] * (x.dim() - 1)))

    def offsets(self, index: Tensor) -> Tensor:
        """[n] token indices of stream 0 -> [K * n]: stream j's copies at + j * T."""
        shift = self.real_tokens * torch.arange(self.k, device=index.device)[:, None]
        return (index[None].long() + shift).reshape(-1)


def _batch(src: LaunchSource, stage: str, num_tokens: int, n: int, slot: Tensor, tok_slot: Tensor, pos: Tensor,
           host_ids: Tensor, kv_len: Tensor, qo_indptr: Tensor, sample: Tensor, gen_index: Tensor,
           logits_index: Tensor) -> LmBatch:
    st, a = src.state, src.step_in.dev
    ps, k = src.page_size, st.kv_streams
    ids = _resolve_ids(st, host_ids, tok_slot, pos)
    page_rows = st.page_table[slot]
    if k == 1:
        column = (pos // ps).clamp(max=st.pages_per_stream - 1)
    else:
        streams = _Streams.of(k, num_tokens, qo_indptr, n)
        ids, pos, tok_slot = ids[streams.source], pos[streams.source], tok_slot[streams.source]
        column = streams.stream * st.pages_per_stream + (pos // ps).clamp(max=st.pages_per_stream - 1)
        page_rows = page_rows.view(n, k, st.pages_per_stream).transpose(0, 1).reshape(k * n, st.pages_per_stream)
        kv_len, logits_index = streams.rows(kv_len), streams.offsets(logits_index)
        qo_indptr = torch.cat([streams.offsets(qo_indptr[:n]), (k * streams.real_tokens).reshape(1)]).int()
        num_tokens *= k
    page = st.page_table[tok_slot, column].long()
    kv_indptr = a[f"{stage}_kv_indptr"][: k * n + 1]
    if src.kv_indices is not None:
        _kv_indices(page_rows, kv_indptr, src.kv_indices)
    rows = launch_rows.LaunchRows(
        slot=slot, positions=pos, kv_len=kv_len, qo_indptr=qo_indptr, gen_index=gen_index, ids=ids,
        page_rows=page_rows, slot_mapping=page * ps + pos % ps, logits_index=logits_index,
        num_codes=st.num_codes[slot], history=_history(st, slot, gen_index, src.repetition_window),
        sampled={name: st[name][slot] for name in launch_rows.SAMPLED},
    )
    return _assemble(src, stage, rows, write_slot=torch.where(sample, slot, st.scratch), num_tokens=num_tokens)


def _assemble(src: LaunchSource, stage: str, r: launch_rows.LaunchRows, *, write_slot: Tensor,
              num_tokens: int) -> LmBatch:
    """The LmBatch of a launch's row and token tensors (either derivation) and the stage's host CSR views."""
    st, h = src.state, src.step_in.host
    attention = AttentionBuffers(
        page_table=r.page_rows, kv_lens=r.kv_len, qo_indptr=r.qo_indptr, slot_mapping=r.slot_mapping,
        kv_indices=src.kv_indices, kv_indptr_host=h[f"{stage}_kv_indptr"], qo_indptr_host=h.get(f"{stage}_qo_indptr"),
        kv_last_page_len_host=h[f"{stage}_last_page_len"],
    )
    s = r.sampled
    sampling = SamplingTensors(
        temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"], min_p=s["min_p"],
        repetition_penalty=s["repetition_penalty"], seed=s["seed"], offset=r.gen_index,
    )
    return LmBatch(
        state=st, num_tokens=num_tokens, num_seqs=r.slot.shape[0], ids=r.ids, positions=r.positions,
        attention=attention, slot=r.slot, write_slot=write_slot, gen_index=r.gen_index, num_codes=r.num_codes,
        logits_index=r.logits_index, sampling=sampling, history=r.history, allow_stop=s["allow_stop"],
        kind_out=src.step_out.dev[f"{stage}_kind"], kv_streams=st.kv_streams,
    )

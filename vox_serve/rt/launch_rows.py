"""An LM launch's per-row bookkeeping in one Triton kernel each, for the launches of a captured stage.

- `decode_rows(src, n)`: what `lm_batch.decode_batch` derives, inside the stage, from the few scalars the host
  gives per row (slot, position, input ids): the table row, the generated index, the ids with generated
  positions filled from the history, the page row and the new token's KV slot, FlashInfer's CSR page list, the
  sampling parameters, the codes so far, the repetition window and the stop mask. In PyTorch that is ~55 small
  kernels (gathers, clamps, wheres, a searchsorted); at one row each costs about as much as its launch gap.
- `commit(batch, sample)`: what `LmBatch.commit` writes for any launch: the rows' sampled tokens into the
  history, their audio codes appended, the code counts advanced and the out kinds (~15 kernels).

One program per row computes the same values, in the same dtypes, as the PyTorch code in `lm_batch`, which stays
the reference and the path for CPU tensors, paired rows (decode_rows) and frame latents (commit). Each returns
None / False where its kernel does not serve; `VOX_LAUNCH_ROWS=0` turns both off. Tests run them through Triton's
interpreter on the CPU (`forced`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from vox_serve.core.plan import ABSENT_ID
from vox_serve.core.request import OutKind
from vox_serve.rt import pdl, triton_ops

try:
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no Triton: lm_batch's PyTorch path runs
    triton = None

forced: bool | None = None  # tests: True serves CPU tensors too (through Triton's interpreter), False nothing
ENV = "VOX_LAUNCH_ROWS"  # 0: lm_batch's PyTorch code on GPUs too (A/B measurements)
SAMPLED = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "allow_stop")


def _on(t: Tensor) -> bool:
    return triton_ops.switched_on(t, forced, ENV, default_on=True)


@dataclass
class LaunchRows:
    """The per-row (n rows) and per-token (T attention tokens) tensors an LmBatch is made of, as lm_batch's
    PyTorch path derives them for any launch and `decode_rows` for a decode launch (T = n)."""

    slot: Tensor  # [n] int64 table rows (scratch for padding)
    positions: Tensor  # [T] int64
    kv_len: Tensor  # [n] int32
    qo_indptr: Tensor  # [n + 1] int32
    gen_index: Tensor  # [n] int64
    ids: Tensor  # [T, input_columns] int64
    page_rows: Tensor  # [n, max_pages_per_seq] int32
    slot_mapping: Tensor  # [T] int64
    logits_index: Tensor  # [n] int64
    num_codes: Tensor  # [n] int64
    history: Tensor  # [n, repetition_window] int64
    sampled: dict[str, Tensor]  # SAMPLED fields gathered at the rows' slots


def serves(src) -> bool:  # noqa: ANN001 - an lm_batch.LaunchSource (imported there, not here)
    return src.state.kv_streams == 1 and _on(src.state.page_table)


def decode_rows(src, n: int) -> LaunchRows | None:  # noqa: ANN001 - an lm_batch.LaunchSource
    """The decode launch of n rows (one token each), or None where the kernel does not serve."""
    if not serves(src):
        return None
    st, a = src.state, src.step_in.dev
    dev = st.page_table.device
    host_ids = a["decode_ids"][:n]
    columns, width, window = host_ids.shape[1], st.page_table.shape[1], src.repetition_window
    i64, i32 = dict(dtype=torch.int64, device=dev), dict(dtype=torch.int32, device=dev)
    out = LaunchRows(
        slot=torch.empty(n, **i64), positions=torch.empty(n, **i64),
        kv_len=torch.empty(n, **i32), qo_indptr=torch.empty(n + 1, **i32),
        gen_index=torch.empty(n, **i64), ids=torch.empty(n, columns, **i64),
        page_rows=torch.empty(n, width, **i32), slot_mapping=torch.empty(n, **i64),
        logits_index=torch.empty(n, **i64), num_codes=torch.empty(n, **i64), history=torch.empty(n, window, **i64),
        sampled={name: torch.empty(n, dtype=st[name].dtype, device=dev) for name in SAMPLED})
    if n == 0:
        out.qo_indptr.zero_()
        return out
    kv_indices = src.kv_indices if src.kv_indices is not None else out.page_rows  # (unwritten without it)
    tables = [st[name] for name in SAMPLED]
    sampled = [out.sampled[name] for name in SAMPLED]
    _decode_rows_kernel[(n,)](
        a["decode_slot"], a["decode_pos"], host_ids, a["decode_kv_indptr"], st["prompt_len"], st["repetition_window"],
        st.num_codes, st.tokens, st.page_table, *tables,
        out.slot, out.positions, out.kv_len, out.qo_indptr, out.gen_index, out.ids, out.page_rows, out.slot_mapping,
        out.logits_index, out.num_codes, out.history, kv_indices, *sampled,
        n, st.scratch, st.max_generated, src.page_size,
        host_ids.stride(0), st.tokens.stride(0), st.tokens.stride(1),
        COLUMNS=columns, CPS=st.tokens.shape[2], WIDTH=width, WINDOW=window,
        C_BLOCK=triton.next_power_of_2(columns), P_BLOCK=triton.next_power_of_2(width),
        W_BLOCK=triton.next_power_of_2(max(window, 1)), HAS_KV_INDICES=src.kv_indices is not None,
        ABSENT=ABSENT_ID, num_warps=1, **pdl.launch_options(st.page_table))
    return out


def commit(batch, sample) -> bool:  # noqa: ANN001 - an lm_batch.LmBatch and its LmSample
    """Write the rows' samples into the slot tables and their kinds into the step's outputs, as LmBatch.commit
    does; False (nothing written) where the kernel does not serve."""
    st, n = batch.state, batch.num_seqs
    if not _on(st.tokens) or (st.latents is not None and sample.latents is not None):
        return False
    tokens, codes, kind = sample.tokens.contiguous(), sample.codes.contiguous(), sample.kind.contiguous()
    if tokens.shape != (n, st.tokens.shape[2]) or codes.dim() != 2 or codes.shape[0] != n:
        return False  # (shapes the PyTorch path broadcasts)
    if n:
        _commit_kernel[(n,)](
            tokens, codes, kind, batch.write_slot, batch.gen_index, batch.num_codes, st.tokens, st.codes,
            st.num_codes, batch.kind_out, st.scratch, st.max_generated, st.max_codes, tokens.stride(0),
            codes.stride(0), st.tokens.stride(0), st.tokens.stride(1), st.codes.stride(0),
            TOK_W=tokens.shape[1], CODE_W=codes.shape[1], T_BLOCK=triton.next_power_of_2(tokens.shape[1]),
            C_BLOCK=triton.next_power_of_2(max(codes.shape[1], 1)), AUDIO=int(OutKind.AUDIO),
            AUDIO_STOP=int(OutKind.AUDIO_STOP), num_warps=1, **pdl.launch_options(st.tokens))
    return True


if triton is not None:

    @triton.jit
    def _gather(table_ptr, out_ptr, slot, i):
        tl.store(out_ptr + i, tl.load(table_ptr + slot))

    @triton.jit(do_not_specialize=["n", "scratch", "max_generated", "page_size", "ids_stride", "tok_s", "tok_g"])
    def _decode_rows_kernel(
        slot_in, pos_in, ids_in, kv_indptr, prompt_len, rep_window, num_codes, tokens, page_table,
        temperature, top_k, top_p, min_p, penalty, seed, allow_stop,
        slot_out, pos_out, kv_len_out, qo_indptr_out, gen_out, ids_out, page_rows_out, slot_mapping_out,
        logits_index_out, num_codes_out, history_out, kv_indices_out,
        temperature_out, top_k_out, top_p_out, min_p_out, penalty_out, seed_out, allow_stop_out,
        n, scratch, max_generated, page_size, ids_stride, tok_s, tok_g,
        COLUMNS: tl.constexpr, CPS: tl.constexpr, WIDTH: tl.constexpr, WINDOW: tl.constexpr, C_BLOCK: tl.constexpr,
        P_BLOCK: tl.constexpr, W_BLOCK: tl.constexpr, HAS_KV_INDICES: tl.constexpr, ABSENT: tl.constexpr,
        PDL: tl.constexpr,
    ):
        pdl.enter(PDL)
        i = tl.program_id(0)
        host_slot = tl.load(slot_in + i).to(tl.int64)
        slot = tl.where(host_slot >= 0, host_slot, scratch)
        pos = tl.load(pos_in + i).to(tl.int64)
        prompt = tl.load(prompt_len + slot)
        gen_index = pos + 1 - prompt
        tl.store(slot_out + i, slot)
        tl.store(pos_out + i, pos)
        tl.store(kv_len_out + i, (pos + 1).to(tl.int32))
        tl.store(qo_indptr_out + i, i)
        tl.store(qo_indptr_out + n, n, mask=i == 0)
        tl.store(gen_out + i, gen_index)
        tl.store(logits_index_out + i, i.to(tl.int64))
        _gather(num_codes, num_codes_out, slot, i)
        _gather(temperature, temperature_out, slot, i)
        _gather(top_k, top_k_out, slot, i)
        _gather(top_p, top_p_out, slot, i)
        _gather(min_p, min_p_out, slot, i)
        _gather(penalty, penalty_out, slot, i)
        _gather(seed, seed_out, slot, i)
        _gather(allow_stop, allow_stop_out, slot, i)

        # ids: a code column's ABSENT id at a generated position comes from the slot's history there
        c = tl.arange(0, C_BLOCK)
        c_mask = c < COLUMNS
        ids = tl.load(ids_in + i * ids_stride + c, mask=c_mask, other=0).to(tl.int64)
        gen_row = pos - prompt
        row = tl.minimum(tl.maximum(gen_row, 0), max_generated - 1)
        fill = (c < CPS) & (ids == ABSENT) & (gen_row >= 0)
        hist = tl.load(tokens + slot * tok_s + row * tok_g + c, mask=c_mask & (c < CPS), other=0).to(tl.int64)
        tl.store(ids_out + i * COLUMNS + c, tl.where(fill, hist, ids), mask=c_mask)

        # the page row, the new token's KV slot and (FlashInfer) the row's used pages in CSR order
        p = tl.arange(0, P_BLOCK)
        p_mask = p < WIDTH
        pages = tl.load(page_table + slot * WIDTH + p, mask=p_mask, other=0)
        tl.store(page_rows_out + i * WIDTH + p, pages, mask=p_mask)
        column = tl.minimum(pos // page_size, WIDTH - 1)
        page = tl.load(page_table + slot * WIDTH + column).to(tl.int64)
        tl.store(slot_mapping_out + i, page * page_size + pos % page_size)
        if HAS_KV_INDICES:
            start = tl.load(kv_indptr + i)
            count = tl.minimum(tl.load(kv_indptr + i + 1) - start, WIDTH)
            tl.store(kv_indices_out + start + p, pages, mask=p < count)
            end = tl.load(kv_indptr + n)
            e = i * WIDTH + p
            tl.store(kv_indices_out + e, tl.zeros_like(pages), mask=p_mask & (e >= end))

        # the repetition window: the first-column tokens of the last WINDOW generated ones (-1 empty)
        if WINDOW > 0:
            w = tl.arange(0, W_BLOCK)
            w_mask = w < WINDOW
            index = gen_index - WINDOW + w
            window = tl.minimum(tl.load(rep_window + slot), WINDOW)
            valid = (index >= 0) & (w >= WINDOW - window)
            past = tl.load(tokens + slot * tok_s + tl.maximum(index, 0) * tok_g, mask=w_mask & valid, other=-1)
            tl.store(history_out + i * WINDOW + w, tl.where(valid, past.to(tl.int64), -1), mask=w_mask)

    @triton.jit(do_not_specialize=["scratch", "max_generated", "max_codes", "tok_stride", "code_stride", "st_s",
                                   "st_g", "codes_s"])
    def _commit_kernel(
        tok_in, codes_in, kind_in, write_slot, gen_index, num_codes, tokens, codes, num_codes_table, kind_out,
        scratch, max_generated, max_codes, tok_stride, code_stride, st_s, st_g, codes_s,
        TOK_W: tl.constexpr, CODE_W: tl.constexpr, T_BLOCK: tl.constexpr, C_BLOCK: tl.constexpr,
        AUDIO: tl.constexpr, AUDIO_STOP: tl.constexpr, PDL: tl.constexpr,
    ):
        pdl.enter(PDL)
        i = tl.program_id(0)
        ws = tl.load(write_slot + i).to(tl.int64)
        g = tl.minimum(tl.maximum(tl.load(gen_index + i), 0), max_generated - 1)
        t = tl.arange(0, T_BLOCK)
        tok = tl.load(tok_in + i * tok_stride + t, mask=t < TOK_W, other=0)
        tl.store(tokens + ws * st_s + g * st_g + t, tok.to(tl.int32), mask=t < TOK_W)
        kind = tl.load(kind_in + i)
        audio = (kind == AUDIO) | (kind == AUDIO_STOP)
        wa = tl.where(audio, ws, scratch)
        c = tl.arange(0, C_BLOCK)
        index = tl.minimum(tl.load(num_codes + i) + c, max_codes - 1)
        code = tl.load(codes_in + i * code_stride + c, mask=c < CODE_W, other=0)
        tl.store(codes + wa * codes_s + index, code.to(tl.int32), mask=c < CODE_W)
        # several rows can share a write slot (the scratch row of padded ones): the counts add atomically
        tl.atomic_add(num_codes_table + wa, tl.where(audio, CODE_W, 0).to(tl.int64), mask=audio)
        tl.store(kind_out + i, kind.to(tl.int32))

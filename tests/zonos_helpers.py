"""An eager Zonos generation loop over our modules (the scheduler-driven program comes later).

It runs the reference's `Zonos.generate` step by step, batch of one request: the conditional and the
unconditional prefix as two sequences of a paged KV cache (TorchAttentionBackend), prefill over
prefix + delayed prefix columns, then one column per decode step, with our guidance, penalty, sampling,
column-write and stop functions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import Tensor

from vox_serve.models.zonos import delay, phonemes, sampling
from vox_serve.models.zonos.config import NUM_CODEBOOKS
from vox_serve.models.zonos.lm import ZonosLM
from vox_serve.rt.attention import AttentionBuffers, AttentionPlan, PlanInputs, make_attention_backend

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "zonos"
PAGE_SIZE = 4


class PagedRows:
    """A few sequences of a paged KV cache with pages handed out in a scrambled order (never page 0)."""

    def __init__(self, lm: ZonosLM, num_seqs: int, max_len: int) -> None:
        cfg = lm.cfg
        self.max_pages = -(-max_len // PAGE_SIZE)
        param = lm.embeddings[0].weight
        self.backend = make_attention_backend(
            "torch", num_layers=cfg.num_layers, num_pages=num_seqs * self.max_pages + 1, page_size=PAGE_SIZE,
            num_q_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, dtype=param.dtype,
            device=param.device)
        order = torch.randperm(num_seqs * self.max_pages, generator=torch.Generator().manual_seed(0)) + 1
        self.pages = order.view(num_seqs, self.max_pages).int()
        self.lens = [0] * num_seqs

    def step(self, qo_lens: list[int]) -> AttentionBuffers:
        """Plan a step that appends qo_lens[i] tokens to sequence i (flattened in sequence order)."""
        kv_lens = [n + q for n, q in zip(self.lens, qo_lens, strict=True)]
        slots = [int(self.pages[i, p // PAGE_SIZE]) * PAGE_SIZE + p % PAGE_SIZE
                 for i, (n, q) in enumerate(zip(self.lens, qo_lens, strict=True)) for p in range(n, n + q)]
        dev = self.backend.device
        bufs = AttentionBuffers(
            page_table=self.pages.to(dev), kv_lens=torch.tensor(kv_lens, dtype=torch.int32, device=dev),
            qo_indptr=torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev))
        plan = AttentionPlan(len(qo_lens), qo_lens, kv_lens, num_rows=len(qo_lens), decode=max(qo_lens) == 1)
        self.backend.plan(plan, PlanInputs(None, None, None, None, max_pages_per_seq=self.max_pages))
        self.lens = kv_lens
        return bufs


@dataclass
class Generation:
    codes: Tensor  # [1, 9, frames]
    delayed: Tensor  # [1, 9, A + 9]
    logits: list[Tensor] = field(default_factory=list)  # guided logits [1, 9, W] of each step


@torch.no_grad()
def generate(lm: ZonosLM, prefix: Tensor, *, max_new_tokens: int, cfg_scale: float, params: sampling.ZonosSampling,
             prefix_codes: Tensor | None = None, repetition_window: int = 2) -> Generation:
    """prefix [2, L, d] (conditional, unconditional), prefix_codes [1, 9, P] or None -> the reference's result."""
    dev = lm.embeddings[0].weight.device
    num_prefix = 0 if prefix_codes is None else prefix_codes.shape[2]
    num_frames = num_prefix + max_new_tokens
    codes = torch.full((1, NUM_CODEBOOKS, num_frames), delay.UNKNOWN, dtype=torch.long, device=dev)
    if prefix_codes is not None:
        codes[..., :num_prefix] = prefix_codes
    delayed = delay.delay(codes)
    rows = PagedRows(lm, 2, prefix.shape[1] + num_frames + NUM_CODEBOOKS)
    scale = torch.tensor([cfg_scale], device=dev)
    frames = torch.tensor([num_frames], device=dev)
    prefix_len = torch.tensor([num_prefix], device=dev)
    out = Generation(codes=torch.empty(0), delayed=delayed)

    def step(x: Tensor, positions: Tensor, qo: int) -> Tensor:
        hidden = lm(x, positions, rows.backend, rows.step([qo, qo]))
        logits = lm.logits(hidden[qo - 1 :: qo])
        guided = sampling.guided_logits(logits[:1], logits[1:], scale, lm.cfg.logits_width)
        out.logits.append(guided)
        return guided

    def write(tokens: Tensor, column: int) -> None:
        col = torch.tensor([column], device=dev)
        unknown = delay.unknown_entries(col, prefix_len, frames)
        delayed[:, :, column] = delay.write_column(tokens, delayed[:, :, column], unknown)

    columns = delayed[0, :, : num_prefix + 1].T  # [P + 1, 9]
    x = torch.cat([prefix.to(lm.embeddings[0].weight.dtype), lm.embed_codes(columns).expand(2, -1, -1)], dim=1)
    qo = x.shape[1]
    write(sampling.sample_codes(step(x.reshape(2 * qo, -1), torch.arange(qo, device=dev).repeat(2), qo), params),
          num_prefix + 1)
    column = num_prefix + 1
    remaining = torch.tensor([delay.decode_steps(max_new_tokens)], device=dev)
    stopping = torch.tensor([False], device=dev)
    while int(remaining.max()) > 0:
        column += 1
        params.offset += 1
        x = lm.embed_codes(delayed[:, :, column - 1]).expand(2, -1)
        logits = sampling.ban_eos_after_head0(step(x, torch.full((2,), prefix.shape[1] + column - 1, device=dev), 1))
        history = delayed[:, :, max(0, column - repetition_window) : column]
        logits = sampling.repetition_penalty(logits, history, params.repetition_penalty)
        tokens, remaining, stopping = delay.stop_rule(sampling.sample_codes(logits, params), remaining, stopping)
        if column < delayed.shape[2]:
            write(tokens, column)
    out.codes = delay.output_frames(delayed, column)
    return out


def scenario_sampling(spec: dict) -> tuple[sampling.ZonosSampling, int]:
    """A fixture scenario's `sampling_params` as ZonosSampling (the reference's dict replaces the default
    min_p wholesale, so a scenario without min_p has it off) and its repetition window."""
    params = dict(spec["generate"]["sampling_params"])
    window = params.pop("repetition_penalty_window", 2)
    return sampling.ZonosSampling.filled(1, **{"min_p": 0.0, **params}), window


def needs_espeak() -> None:
    """Skip (fail with VOX_REQUIRE_ESPEAK=1, as CI sets) where phonemizer + espeak-ng are missing: text
    prompts need them (the GPU host has neither)."""
    why = phonemes.espeak_available()
    if why is None:
        return
    reason = f"phonemizer + espeak-ng unavailable ({why}): run scripts/install_system_deps.sh"
    if os.environ.get("VOX_REQUIRE_ESPEAK") == "1":
        pytest.fail(reason)
    pytest.skip(reason)

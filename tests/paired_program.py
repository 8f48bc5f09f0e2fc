"""A test-only program with paired rows (`ProgramLayout.kv_streams = 2`), the engine's mechanism for
classifier-free guidance, independent of any real model.

Each request owns two KV sequences of equal length. Both streams read the same input ids; their prompt
vectors differ (a prompt vector holds both streams' parts side by side), so their hidden states and
logits differ. Each row's two logit sets are mixed with the request's `cfg_scale` (a declared slot
field) before one sample per column is drawn: `uncond + (cond - uncond) * cfg_scale`. Tiny random
weights; one attention layer over the paged KV cache. `reference_generate` recomputes both streams as
whole sequences without the engine, for the tests to compare against.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from vox_serve.core.meta import ProgramLayout, ProgramMeta, SlotField, StopRule
from vox_serve.core.request import OutKind, Prompt
from vox_serve.rt import kernels
from vox_serve.rt.codec_window import CodecWindow
from vox_serve.rt.lm_batch import LmBatch, LmSample
from vox_serve.rt.program import Program

VOCAB, COLUMNS, STREAMS = 24, 2, 2


def paired_meta(dim: int) -> ProgramMeta:
    return ProgramMeta(
        name="paired", sample_rate=1000, input_columns=COLUMNS, codes_per_step=COLUMNS, codes_per_frame=COLUMNS,
        samples_per_frame=10, frames_per_chunk=2, codec_lookback_frames=0, codec_lookahead_frames=0,
        skip_leading_frames=0, max_model_len=64, max_text_chars=100, stop_rule=StopRule(token=VOCAB),
        default_sampling={"repetition_window": 8}, accepted_fields=("text",),
        layout=ProgramLayout(prompt_vector_dim=dim, max_prompt_vectors=16, kv_streams=STREAMS,
                             slot_fields=(SlotField("cfg_scale", (1,)),)),
    )


class PairedProgram(Program):
    def __init__(self, seed: int = 0, heads: int = 2, head_dim: int = 4, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__(torch.device(device), dtype)
        self.heads, self.head_dim, self.dim = heads, head_dim, heads * head_dim
        self.meta = paired_meta(self.dim)
        g = torch.Generator().manual_seed(seed)

        def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * scale).to(self.device, dtype)

        d = self.dim
        self.emb = rand(COLUMNS, VOCAB, d)
        self.wq, self.wk, self.wv = (rand(d, d, scale=d**-0.5) for _ in range(3))
        self.wo = rand(d, d, scale=0.5 * d**-0.5)
        self.heads_w = rand(COLUMNS, d, VOCAB)

    def kv_geometry(self) -> tuple[int, int, int, int]:
        return 1, self.heads, self.heads, self.head_dim

    def preprocess(self, fields: dict[str, Any]) -> Prompt:
        raise NotImplementedError("tests build prompts directly")

    # ---- the model, shared with the reference ------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T, COLUMNS] (-1 absent) -> [T, dim]: the sum of the present columns' embeddings."""
        out = torch.zeros(ids.shape[0], self.dim, device=self.device, dtype=self.dtype)
        for c in range(COLUMNS):
            present = (ids[:, c] >= 0)[:, None]
            out = out + torch.where(present, self.emb[c][ids[:, c].clamp(min=0)], 0.0)
        return out

    def guided(self, hidden: torch.Tensor, cfg_scale: torch.Tensor) -> torch.Tensor:
        """hidden [2, n, dim] (conditional, unconditional), cfg_scale [n] -> mixed logits [n, COLUMNS, VOCAB]."""
        cond, uncond = (torch.einsum("nd,cdv->ncv", h, self.heads_w).float() for h in hidden)
        return uncond + (cond - uncond) * cfg_scale[:, None, None]

    # ---- stages --------------------------------------------------------------------------------
    def lm_step(self, b: LmBatch) -> LmSample:
        x = self.embed(b.ids)
        if b.prompt_vectors is not None:
            x = x.index_add(0, b.prompt_vectors[0], b.prompt_vectors[1].to(x.dtype))
        q, k, v = ((x @ w).view(-1, self.heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        h = x + self.attention.forward(0, q, k, v, b.attention).reshape(-1, self.dim) @ self.wo
        hidden = h[b.logits_index].view(b.kv_streams, b.num_seqs, self.dim)
        logits = self.guided(hidden, b.state["cfg_scale"][b.slot, 0])
        frame = torch.stack([kernels.sample(logits[:, c], b.sampling) for c in range(COLUMNS)], dim=1)
        kind = torch.full_like(frame[:, 0], int(OutKind.AUDIO))
        return LmSample(tokens=frame, codes=frame, kind=kind)

    def decode_audio(self, window: CodecWindow, frames: int) -> torch.Tensor:
        value = torch.tanh(0.05 * window.codes.float().sum(-1) - 0.5)  # [K, window]
        return value[:, :frames].repeat_interleave(self.meta.samples_per_frame, dim=1)


def paired_prompt(ids: Any, cond: dict[int, Any], uncond: dict[int, Any], cfg_scale: float) -> Prompt:
    """A prompt whose two streams get different vectors at the given positions (zeros where one is absent)."""
    dim = len(next(iter({**cond, **uncond}.values())))
    zero = [0.0] * dim
    vectors = {p: [*cond.get(p, zero), *uncond.get(p, zero)] for p in {*cond, *uncond}}
    return Prompt.of(ids, vectors, {"cfg_scale": [cfg_scale]})


# ---- the reference: both streams recomputed over whole sequences, no engine ---------------------
def reference_generate(p: PairedProgram, prompt: Prompt, steps: int) -> list[list[int]]:
    """Greedy token rows, recomputing every position of both streams each step."""
    rows = [list(r) for r in prompt.ids.tolist()]
    vectors = torch.zeros(STREAMS, len(rows), p.dim)
    for pos, vec in prompt.vectors.items():
        vectors[:, pos] += torch.as_tensor(vec).view(STREAMS, p.dim)
    scale = torch.tensor(prompt.conditioning["cfg_scale"], device=p.device)
    greedy = kernels.SamplingTensors.filled(1, temperature=0.0, device=p.device)
    out = []
    for _ in range(steps):
        ids = torch.tensor(rows, device=p.device)
        last = []
        for stream in range(STREAMS):
            x = p.embed(ids)
            x[: vectors.shape[1]] += vectors[stream].to(p.device, p.dtype)
            q, k, v = ((x @ w).view(-1, p.heads, p.head_dim).transpose(0, 1) for w in (p.wq, p.wk, p.wv))
            attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
            h = x + attn.transpose(0, 1).reshape(-1, p.dim) @ p.wo
            last.append(h[-1:])
        logits = p.guided(torch.stack(last), scale)
        frame = [int(kernels.sample(logits[:, c], greedy)[0]) for c in range(COLUMNS)]
        out.append(frame)
        rows.append(frame)
    return out

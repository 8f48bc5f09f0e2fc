"""A test-only program that uses every field a program can declare beyond the common ones.

Three input columns (two code columns and a "text" column), prompt vectors added to prompt
positions, a per-slot conditioning field set at admission (`cond`, [3, DIM], read by the LM and by
the codec), and a float latent per frame that the LM leaves for the codec. Tiny random weights; one
attention layer over the paged KV cache. `reference_generate` / `reference_pcm` compute the same
thing without the engine, as a whole-sequence recomputation, for the tests to compare against.
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

VOCAB, DIM, HEADS, HEAD_DIM, LATENT = 32, 8, 2, 4, 3
COND_ROWS = 3

META = ProgramMeta(
    name="declared", sample_rate=1000, input_columns=3, codes_per_step=2, codes_per_frame=2, samples_per_frame=10,
    frames_per_chunk=2, codec_lookback_frames=1, codec_lookahead_frames=0, skip_leading_frames=1, max_model_len=64,
    max_text_chars=100, stop_rule=StopRule(token=VOCAB), default_sampling={"repetition_window": 8},
    accepted_fields=("text",),
    layout=ProgramLayout(prompt_vector_dim=DIM, max_prompt_vectors=8,
                         slot_fields=(SlotField("cond", (COND_ROWS, DIM)),), frame_latent_dim=LATENT),
)


class DeclaredProgram(Program):
    def __init__(self, seed: int = 0) -> None:
        super().__init__(torch.device("cpu"), torch.float32)
        self.meta = META
        g = torch.Generator().manual_seed(seed)
        rand = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
        self.emb = rand(3, VOCAB, DIM)  # one table per input column
        self.wq, self.wk, self.wv, self.wo = rand(DIM, DIM), rand(DIM, DIM), rand(DIM, DIM), rand(DIM, DIM) * 0.3
        self.heads = rand(2, DIM, VOCAB)
        self.w_latent = rand(DIM, LATENT)

    def kv_geometry(self) -> tuple[int, int, int, int]:
        return 1, HEADS, HEADS, HEAD_DIM

    def preprocess(self, fields: dict[str, Any]) -> Prompt:
        raise NotImplementedError("tests build prompts directly")

    # ---- the model, shared with the reference ------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T, 3] (-1 absent) -> [T, DIM]: the sum of the present columns' embeddings."""
        out = torch.zeros(ids.shape[0], DIM)
        for c in range(3):
            present = (ids[:, c] >= 0)[:, None]
            out += torch.where(present, self.emb[c][ids[:, c].clamp(min=0)], 0.0)
        return out

    @staticmethod
    def cond_mean(cond: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """cond [n, COND_ROWS, DIM], length [n] -> the mean of each slot's first `length` rows [n, DIM]."""
        rows = torch.arange(COND_ROWS)[None, :, None] < length[:, None, None]
        return (cond * rows).sum(1) / length.clamp(min=1)[:, None]

    def sample_frame(self, last: torch.Tensor, params: kernels.SamplingTensors) -> torch.Tensor:
        logits = torch.einsum("nd,cdv->ncv", last, self.heads)
        return torch.stack([kernels.sample(logits[:, c], params) for c in range(2)], dim=1)

    # ---- stages --------------------------------------------------------------------------------
    def lm_step(self, b: LmBatch) -> LmSample:
        x = self.embed(b.ids)
        if b.prompt_vectors is not None:
            x = x.index_add(0, *b.prompt_vectors)
        q, k, v = ((x @ w).view(-1, HEADS, HEAD_DIM) for w in (self.wq, self.wk, self.wv))
        h = x + self.attention.forward(0, q, k, v, b.attention).reshape(-1, DIM) @ self.wo
        st = b.state
        last = h[b.logits_index] + self.cond_mean(st["cond"][b.slot], st["cond_len"][b.slot])
        frame = self.sample_frame(last, b.sampling)
        kind = torch.full_like(frame[:, 0], int(OutKind.AUDIO))
        return LmSample(tokens=frame, codes=frame, kind=kind, latents=last @ self.w_latent)

    def codec_modules(self) -> list[torch.nn.Module]:
        return []  # the codec is a formula over plain tensors (and the slots' conditioning)

    def decode_audio(self, window: CodecWindow, frames: int) -> torch.Tensor:
        st = self.state
        cond = self.cond_mean(st["cond"][window.slot], st["cond_len"][window.slot]).mean(-1)
        value = frame_value(window.codes, window.latents, cond)  # [K, window]
        emitted = value[:, self.meta.codec_lookback_frames : self.meta.codec_lookback_frames + frames]
        return emitted.repeat_interleave(self.meta.samples_per_frame, dim=1)


def frame_value(codes: torch.Tensor, latents: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    """codes [K, W, 2], latents [K, W, LATENT], cond [K] -> one sample value per frame [K, W]."""
    return torch.tanh(0.01 * codes.float().sum(-1) + latents.mean(-1) + cond[:, None])


# ---- the reference: the same model recomputed over whole sequences, no engine -----------------
def reference_generate(p: DeclaredProgram, prompt: Prompt, steps: int) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy token rows and the latent of each, recomputing every position each step."""
    rows = [list(r) for r in prompt.ids.tolist()]
    vectors = torch.zeros(len(rows), DIM)
    for pos, vec in prompt.vectors.items():
        vectors[pos] += torch.as_tensor(vec)
    cond = torch.as_tensor(prompt.conditioning["cond"])
    cond_full = torch.zeros(COND_ROWS, DIM)
    cond_full[: len(cond)] = cond
    cond_term = p.cond_mean(cond_full[None], torch.tensor([len(cond)]))[0]
    greedy = kernels.SamplingTensors.filled(1, temperature=0.0)
    out, latents = [], []
    for _ in range(steps):
        ids = torch.tensor(rows)
        x = p.embed(ids)
        x[: vectors.shape[0]] += vectors
        q, k, v = ((x @ w).view(-1, HEADS, HEAD_DIM).transpose(0, 1) for w in (p.wq, p.wk, p.wv))
        attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
        h = x + attn.transpose(0, 1).reshape(-1, DIM) @ p.wo
        last = h[-1:] + cond_term
        frame = p.sample_frame(last, greedy)[0].tolist()
        out.append(frame)
        latents.append((last @ p.w_latent)[0])
        rows.append(frame + [-1])
    return out, torch.stack(latents)

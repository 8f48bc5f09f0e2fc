"""A depth transformer: a small decoder run afresh for every frame of a multi-codebook LM, over a fixed
number of positions, with a static KV cache (Qwen3-TTS's code predictor, CSM's depth decoder).

Position 0 holds the LM's hidden state for the frame; position p >= 1 the embedding of the frame's code
p - 1 (from the LM's tables); every input goes through `in_proj` first (a projector to the depth
transformer's width, or the identity). `step` runs the next positions of every row and returns the logits
of the last one through one of the per-codebook heads. The KV cache [layers, rows, positions, KV heads,
head dim] is allocated once at the largest batch (`allocate`) and rewritten every frame, so a step is
capturable: static shapes, no host synchronisation. The positions, cache slots and attention mask of a step
depend only on its first position, its number of positions and the rows: `allocate` builds them for the
steps a frame runs (one or two positions), so a step launches no kernels to make them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vox_serve.layers.decoder import DecoderDims, DecoderLayer, RMSNorm, project, run_layers
from vox_serve.layers.rope import RotaryEmbedding
from vox_serve.rt import depth_attention, depth_step, small_gemm
from vox_serve.rt.attention.kv_write import QKPrep, write_kv


@dataclass(frozen=True)
class StepTables:
    positions: Tensor  # [rows * n] int64
    slots: Tensor  # [rows * n] int64
    mask: Tensor  # [n, num_positions] additive (0 or -inf)


class DepthTransformer(nn.Module):
    """`heads` [num_heads_out, vocab, hidden]: head i predicts from position i + 1 (the code after it)."""

    def __init__(self, *, dims: DecoderDims, in_proj: nn.Module, num_positions: int, num_heads_out: int,
                 rope: dict[str, Any], qk_norm: bool) -> None:
        super().__init__()
        self.cfg, self.num_positions = dims, num_positions
        self.in_proj = in_proj
        self.layers = nn.ModuleList(
            DecoderLayer(dims.hidden_size, dims.intermediate_size, dims.num_heads, dims.num_kv_heads, dims.head_dim,
                         dims.rms_norm_eps, i, qk_norm=qk_norm)
            for i in range(dims.num_layers))
        self.norm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)
        self.heads = nn.Parameter(torch.empty(num_heads_out, dims.vocab_size, dims.hidden_size))
        self.rope = RotaryEmbedding(dims.head_dim, num_positions, rope)
        self.k_cache: Tensor | None = None
        self.v_cache: Tensor | None = None
        self._step_tables: dict[tuple[int, int], StepTables] = {}
        self._stacked: depth_step.Stacked | None = None

    def allocate(self, max_rows: int) -> None:
        """The static KV buffers [layers, rows, positions, kv heads, head dim], once, at the largest batch."""
        c = self.cfg
        shape = (c.num_layers, max_rows, self.num_positions, c.num_kv_heads, c.head_dim)
        w = self.heads
        self.k_cache = torch.zeros(shape, dtype=w.dtype, device=w.device)
        self.v_cache = torch.zeros(shape, dtype=w.dtype, device=w.device)
        self._step_tables = {(start, n): self._make_tables(start, n, max_rows, w.device)
                             for n in (1, 2) for start in range(self.num_positions - n + 1)}
        self._stacked = depth_step.prepare(self)  # the one-kernel step's stacks, where it can serve

    def _make_tables(self, start: int, n: int, rows: int, device: torch.device) -> StepTables:
        """Positions [rows * n], cache slots (row r's position p at r * num_positions + p) and the additive mask
        [n, num_positions] of a step over positions start..start+n-1; the first b * n entries serve b rows."""
        positions = torch.arange(start, start + n, device=device).repeat(rows)
        row = torch.arange(rows, device=device)[:, None]
        slots = (row * self.num_positions + positions.view(rows, n)).reshape(-1)
        # Positions past a query's own hold another frame's (or a padded row's) keys: masked out.
        visible = torch.arange(self.num_positions, device=device)[None, :] <= positions[:n, None]
        mask = torch.zeros(visible.shape, dtype=self.heads.dtype, device=device).masked_fill(~visible, float("-inf"))
        return StepTables(positions=positions, slots=slots, mask=mask)

    def _tables(self, start: int, n: int, b: int, device: torch.device) -> StepTables:
        tables = self._step_tables.get((start, n))
        if tables is None or tables.positions.numel() < b * n:
            tables = self._make_tables(start, n, b, device)
        return StepTables(positions=tables.positions[: b * n], slots=tables.slots[: b * n], mask=tables.mask)

    def step(self, x: Tensor, start: int, head: int) -> Tensor:
        """Inputs x [B, n, input width] at positions start..start+n-1 -> float32 logits [B, vocab] of the last
        position through head `head`."""
        b, n, _ = x.shape
        tables = self._tables(start, n, b, x.device)
        if n == 1 and self._stacked is not None:  # the whole step in one persistent kernel (rt/depth_step)
            logits = depth_step.run(self, self._stacked, x.reshape(b, -1), tables.slots, tables.positions, head)
            if logits is not None:
                return logits
        h = x.reshape(b * n, -1)
        h = project(self.in_proj, h) if isinstance(self.in_proj, nn.Linear) else self.in_proj(h)

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor, prep: QKPrep) -> Tensor:
            kc, vc = self.k_cache[layer], self.v_cache[layer]
            args = prep.kernel_args()
            fused = None if args is None else depth_attention.attend(q, k, v, kc, vc, tables.slots, rows=b, **args)
            if fused is not None:  # the preparation, the cache write and the attention: one kernel
                return fused
            q = write_kv(kc, vc, q, k, v, tables.slots, prep)
            qh = q.view(b, n, *q.shape[1:]).transpose(1, 2)  # [B, Hq, n, D]
            out = F.scaled_dot_product_attention(qh, kc[:b].transpose(1, 2), vc[:b].transpose(1, 2),
                                                 attn_mask=tables.mask.to(q.dtype), enable_gqa=True)
            return out.transpose(1, 2).reshape(b * n, *q.shape[1:])

        h, delta = run_layers(self.layers, h, tables.positions, self.rope, attend)
        return self._head_logits(h.view(b, n, -1)[:, -1], None if delta is None else delta.view(b, n, -1)[:, -1],
                                 head)

    def _head_logits(self, stream: Tensor, delta: Tensor | None, head: int) -> Tensor:
        """The final norm of the last position's stream (+ delta) through head `head` -> float32 logits."""
        fused = small_gemm.norm_linear(stream, delta, self.norm, self.heads[head], out_dtype=torch.float32)
        if fused is not None:
            return fused[1]
        return (self.norm(stream, delta) @ self.heads[head].t()).float()

    def sample_frame(self, hidden: Tensor, first: Tensor, embed: Callable[[int, Tensor], Tensor],
                     sample: Callable[[Tensor, int], Tensor]) -> Tensor:
        """The rest of a frame after its first code: hidden [n, H] (the LM's, position 0) and first [n]
        (codebook 0, position 1) -> the frame [n, num_heads_out + 1].

        `embed(k, codes)` gives the LM-side embeddings [n, H] of codebook k's codes; `sample(logits, k)` the
        codes [n] of codebook k from its float32 logits [n, vocab].
        """
        codes = [first]
        x = torch.stack([hidden, embed(0, first)], dim=1)  # [n, 2, H]
        for k in range(1, self.heads.shape[0] + 1):
            # The first step feeds positions 0 and 1, each later one the code just sampled.
            code = sample(self.step(x, start=0 if k == 1 else k, head=k - 1), k)
            codes.append(code)
            x = embed(k, code).unsqueeze(1)
        return torch.stack(codes, dim=1)

    def memory_bytes(self) -> int:
        caches = [c for c in (self.k_cache, self.v_cache) if c is not None]
        return sum(c.numel() * c.element_size() for c in caches)

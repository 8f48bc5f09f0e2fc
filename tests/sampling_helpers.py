"""Random sampler inputs shared by the GPU kernel tests (Triton and Rust against the reference)."""

from __future__ import annotations

import torch

from vox_serve.rt import kernels


def random_params(rows: int, gen: torch.Generator, greedy_rows: int = 32) -> kernels.SamplingTensors:
    """Per-row parameters with every filter active somewhere; the first `greedy_rows` rows greedy.

    Even rows have a top-p below 1 (the Rust kernel sorts them); odd rows have top_p = 1.0 (it
    samples them without sorting), with top-k and min-p (rows 1 mod 6), top-k without min-p
    (3 mod 6) and min-p without top-k (5 mod 6). Greedy rows come in both kinds.
    """
    params = kernels.SamplingTensors(
        temperature=torch.rand(rows, generator=gen) * 1.5, top_k=torch.randint(0, 60, (rows,), generator=gen),
        top_p=torch.rand(rows, generator=gen) * 0.5 + 0.5, min_p=torch.rand(rows, generator=gen) * 0.1,
        repetition_penalty=torch.rand(rows, generator=gen) + 1.0,
        seed=torch.randint(0, 2**40, (rows,), generator=gen), offset=torch.randint(0, 10**6, (rows,), generator=gen))
    params.temperature[:greedy_rows] = 0.0
    row = torch.arange(rows)
    params.top_p[row % 2 == 1] = 1.0
    with_k = (row % 6 == 1) | (row % 6 == 3)
    params.top_k[with_k] = params.top_k[with_k].clamp(min=1)
    params.min_p[row % 6 == 3] = 0.0
    params.top_k[row % 6 == 5] = 0
    return params


def random_case(rows: int, vocab: int, gen: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, kernels.SamplingTensors]:
    """(logits [rows, vocab], allowed mask (token 0 always allowed), history [rows, 16], params)."""
    logits = torch.randn(rows, vocab, generator=gen) * 3
    allowed = torch.rand(rows, vocab, generator=gen) > 0.1
    allowed[:, 0] = True
    history = torch.randint(-1, vocab, (rows, 16), generator=gen)
    return logits, allowed, history, random_params(rows, gen)


def to_cuda(params: kernels.SamplingTensors) -> kernels.SamplingTensors:
    return kernels.SamplingTensors(**{k: v.cuda() for k, v in vars(params).items()})

"""rt.slot_head: the per-row window logits kernel against the PyTorch gather form, and Orpheus's constrained
sampling with the kernel forced against its PyTorch path.

The kernel checks run on the CPU through Triton's interpreter, which is chosen when Triton is imported: each runs
this file as a script in a fresh process with TRITON_INTERPRET=1 (`python tests/test_slot_head.py <check>`).
The interpreter's bfloat16 tl.dot is wrong (Triton 3.9), so on the CPU the tensor-core path is checked in float32
only; the GPU tier below (marked gpu) covers bfloat16, and `python tests/test_slot_head.py bench` times it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None


def reference(hidden: torch.Tensor, weight: torch.Tensor, base: int, slot: torch.Tensor, width: int,
              num_slots: int, extra_id: int) -> torch.Tensor:
    """The unfused form: every window's product, the row's window gathered, the extra column."""
    n = hidden.shape[0]
    windows = (hidden @ weight[base : base + width * num_slots].t()).float().view(n, num_slots, width)
    own = windows.gather(1, slot.view(n, 1, 1).expand(n, 1, width)).squeeze(1)
    extra = (hidden @ weight[extra_id]).float().unsqueeze(1)
    return torch.cat([own, extra], dim=1)


# ---- in-process: where the kernel does not serve ------------------------------------------------------------

def test_returns_none_where_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    from vox_serve.rt import slot_head

    h, w, slot = torch.randn(4, 8), torch.randn(50, 8), torch.zeros(4, dtype=torch.long)
    monkeypatch.setattr(slot_head, "forced", None)
    assert slot_head.slot_logits(h, w, 10, slot, 10, 3, 1) is None  # CPU tensors, nothing forced
    monkeypatch.setattr(slot_head, "forced", lambda m, k, dtype: slot_head.BlockConfig(16, 8, dot=False))
    big = torch.randn(slot_head.MAX_ROWS + 1, 8)
    assert slot_head.slot_logits(big, w, 10, torch.zeros(big.shape[0], dtype=torch.long), 10, 3, 1) is None
    assert slot_head.slot_logits(h[:0], w, 10, slot[:0], 10, 3, 1) is None
    assert slot_head.slot_logits(h.bfloat16(), w, 10, slot, 10, 3, 1) is None  # dtypes differ
    assert slot_head.slot_logits(h, w.t().contiguous().t(), 10, slot, 10, 3, 1) is None  # weight not contiguous
    assert slot_head.slot_logits(h, w[:, :4], 10, slot, 10, 3, 1) is None  # K differs


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_rejects_windows_outside_the_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    from vox_serve.rt import slot_head

    monkeypatch.setattr(slot_head, "forced", lambda m, k, dtype: slot_head.BlockConfig(16, 8, dot=False))
    h, w, slot = torch.randn(2, 8), torch.randn(50, 8), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError):
        slot_head.slot_logits(h, w, 30, slot, 10, 3, 1)  # windows end at 60 > 50 rows
    with pytest.raises(ValueError):
        slot_head.slot_logits(h, w, 0, slot, 10, 3, 50)


# ---- through the interpreter ------------------------------------------------------------------------------

@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
@pytest.mark.parametrize("check", ["kernel", "orpheus"])
def test_interpreted(check: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), check], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def check_kernel(device: str = "cpu") -> None:
    """Rows 1, 5, 16 at random slots (some slots absent, one case with every row at one slot), K and the window
    not multiples of the blocks, the FMA and tensor-core paths; float32 within summation-order error, bfloat16
    rounded like the unfused product (equal but for rare one-ulp flips at a rounding boundary)."""
    from vox_serve.rt import slot_head

    gen = torch.Generator().manual_seed(3)
    k, width, num_slots, base, extra_id, vocab = 80, 40, 3, 21, 7, 150
    configs = (slot_head.BlockConfig(16, 32, dot=False), slot_head.BlockConfig(32, 64, dot=False, warps=2),
               slot_head.BlockConfig(16, 32, dot=True), slot_head.BlockConfig(32, 128, dot=True))
    for dtype in (torch.float32, torch.bfloat16):
        for config in configs:
            if dtype == torch.bfloat16 and config.dot and device == "cpu":
                continue  # the interpreter's bfloat16 tl.dot is wrong (Triton 3.9)
            slot_head.forced = lambda m, kk, dt, c=config: c
            for m, slots in ((1, None), (5, None), (16, None), (5, [2])):
                choices = torch.tensor(slots if slots is not None else [0, 2] if m == 5 else range(num_slots))
                slot = choices[torch.randint(0, len(choices), (m,), generator=gen)]
                hidden = torch.randn(m, k, generator=gen).to(dtype)
                weight = (torch.randn(vocab, k, generator=gen) / 4).to(dtype)
                got = slot_head.slot_logits(hidden.to(device), weight.to(device), base, slot.to(device), width,
                                            num_slots, extra_id)
                ref = reference(hidden, weight, base, slot, width, num_slots, extra_id)
                what = (dtype, config, m, slot.tolist())
                assert got is not None and got.dtype == torch.float32 and got.shape == (m, width + 1), what
                got = got.cpu()
                err = ((got - ref).abs() / (ref.abs() + 1)).max().item()
                if dtype == torch.float32:
                    # a GPU's tensor cores would take float32 as TF32; the kernel asks for IEEE products
                    assert err < 1e-5, (what, err)
                else:
                    assert err < 1e-2, (what, err)  # one bfloat16 ulp at most
                    assert (got == ref).float().mean().item() > 0.95, what
    slot_head.forced = None


def check_orpheus(device: str = "cpu") -> None:
    """OrpheusProgram._draw_constrained with the kernel forced draws the same candidates as its PyTorch path:
    rows at slots 0, 3 and 6 (the others absent), histories holding in-slot ids, other slots' ids and the stop
    id, stop allowed or not, sampled (temperature, top-p, repetition penalty) and greedy rows; bfloat16 and
    float32 weights (bfloat16 in the interpreter: the logits themselves equal too; on a GPU cuBLAS sums in another
    order, so a logit may round to the neighbouring bfloat16 value)."""
    from vox_serve.models.orpheus import program as orpheus
    from vox_serve.models.orpheus import step_kernels
    from vox_serve.rt import kernels, slot_head

    gen = torch.Generator().manual_seed(5)
    vocab = orpheus.AUDIO_START + orpheus.SLOTS_PER_FRAME * orpheus.CODES_PER_SLOT + 2
    k, m = 32, 6
    captured: list[torch.Tensor] = []
    real_sample = kernels.sample

    def sample(logits, params, history=None, allowed=None):
        captured.append(logits)
        return real_sample(logits, params, history, allowed)

    served: list[bool] = []
    real_slot_logits = slot_head.slot_logits

    def slot_logits(*args):
        out = real_slot_logits(*args)
        served.append(out is not None)
        return out

    kernels.sample, slot_head.slot_logits = sample, slot_logits
    try:
        for dtype in (torch.bfloat16, torch.float32):
            weight = (torch.randn(vocab, k, generator=gen) / 4).to(dtype).to(device)
            stub = SimpleNamespace(lm=SimpleNamespace(lm_head=SimpleNamespace(weight=weight)))
            hidden = torch.randn(m, k, generator=gen).to(dtype).to(device)
            slot = torch.tensor([0, 3, 3, 6, 0, 6], device=device)
            base = orpheus.AUDIO_START + orpheus.CODES_PER_SLOT * slot
            history = torch.full((m, 16), -1, dtype=torch.long)
            history[:, :6] = base.cpu()[:, None] + torch.randint(0, orpheus.CODES_PER_SLOT, (m, 6), generator=gen)
            history[:, 6:9] = orpheus.AUDIO_START + torch.randint(0, 7 * orpheus.CODES_PER_SLOT, (m, 3), generator=gen)
            history[::2, 9] = orpheus.STOP_ID
            sampling = kernels.SamplingTensors.filled(m, temperature=0.6, top_p=0.8, repetition_penalty=1.3,
                                                      device=device)
            sampling.temperature[1] = 0.0  # a greedy row
            sampling.seed.copy_(torch.arange(m, device=device) * 7 + 1)
            b = SimpleNamespace(history=history.to(device), sampling=sampling,
                                allow_stop=torch.tensor([True, False, True, True, True, False], device=device))
            tokens = []
            for config in (None, slot_head.BlockConfig(64, 32, dot=False)):
                slot_head.forced = None if config is None else (lambda mm, kk, dt, c=config: c)
                os.environ["VOX_SLOT_HEAD"] = "0" if config is None else "1"  # on a GPU: the PyTorch path first
                tokens.append(orpheus.OrpheusProgram._draw_constrained(stub, hidden, b, slot).cpu())
            slot_head.forced = None
            os.environ.pop("VOX_SLOT_HEAD")
            assert served[-2:] == [False, True], served  # the PyTorch path, then the kernel
            plain, fused = captured[-2].cpu(), captured[-1].cpu()
            assert plain.shape == fused.shape == (m, orpheus.CODES_PER_SLOT + 1)
            assert ((plain - fused).abs() / (plain.abs() + 1)).max().item() < 1e-5, dtype
            if dtype == torch.bfloat16 and device == "cpu":
                assert torch.equal(plain, fused)
            assert torch.equal(tokens[0], tokens[1]), (dtype, tokens)
            token = step_kernels.emit_reference(tokens[0], slot.cpu())[0]
            audio = token != orpheus.STOP_ID
            code = token - base.cpu()
            assert ((code[audio] >= 0) & (code[audio] < orpheus.CODES_PER_SLOT)).all()
    finally:
        kernels.sample, slot_head.slot_logits = real_sample, real_slot_logits
        slot_head.forced = None
        os.environ.pop("VOX_SLOT_HEAD", None)


# ---- GPU tier: the compiled kernel ------------------------------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="CUDA + Triton")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("check", ["kernel", "orpheus"])
def test_compiled(check: str) -> None:
    """The interpreter checks with the kernel compiled (bfloat16 on the tensor cores too)."""
    globals()[f"check_{check}"]("cuda")


@pytest.mark.gpu
@needs_gpu
def test_orpheus_shape_default_config_in_a_cuda_graph() -> None:
    """Orpheus 3B's head (K 3072, 7 windows of 4096, bfloat16) with the default configuration, launched from a
    CUDA graph: replays after the rows' slots change in place give the new slots' logits."""
    from vox_serve.models.orpheus.program import AUDIO_START, CODES_PER_SLOT, SLOTS_PER_FRAME, STOP_ID
    from vox_serve.rt import slot_head

    assert slot_head.forced is None
    gen = torch.Generator(device="cuda").manual_seed(11)
    k, vocab = 3072, AUDIO_START + SLOTS_PER_FRAME * CODES_PER_SLOT + 6
    weight = (torch.randn(vocab, k, device="cuda", generator=gen) * 0.02).bfloat16()
    args = (AUDIO_START, CODES_PER_SLOT, SLOTS_PER_FRAME, STOP_ID)
    for m in (1, 2, 8, 16):
        hidden = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        slot = torch.randint(0, SLOTS_PER_FRAME, (m,), device="cuda", generator=gen)
        out = slot_head.slot_logits(hidden, weight, args[0], slot, *args[1:])  # compiles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = slot_head.slot_logits(hidden, weight, args[0], slot, *args[1:])
        for trial in range(3):
            if trial:
                slot.copy_(torch.randint(0, SLOTS_PER_FRAME, (m,), device="cuda", generator=gen))
                hidden.copy_(torch.randn(m, k, device="cuda", generator=gen).bfloat16())
            graph.replay()
            ref = reference(hidden, weight, args[0], slot, *args[1:])
            err = ((out - ref).abs() / (ref.abs() + 1)).max().item()
            assert err < 1e-2, (m, trial, err)
            assert (out == ref).float().mean().item() > 0.9, (m, trial)


def check_bench(device: str = "cuda") -> None:
    """Not a test: `python tests/test_slot_head.py bench` on a GPU prints the microseconds per call (CUDA-graph
    replays) of Orpheus 3B's constrained head, the PyTorch path against the kernel's default and a few other
    configurations, rows at one slot and spread over all 7."""
    from vox_serve.models.orpheus.program import AUDIO_START, CODES_PER_SLOT, SLOTS_PER_FRAME, STOP_ID
    from vox_serve.rt import slot_head

    k, vocab = 3072, 156940
    weight = (torch.randn(vocab, k, device=device) * 0.02).bfloat16()
    args = (CODES_PER_SLOT, SLOTS_PER_FRAME, STOP_ID)

    sys.path.insert(0, str(ROOT / "benchmark"))
    from sampler import graph_us  # the benchmarks' CUDA-graph timer

    def timed(fn, *fn_args) -> float:
        return graph_us(lambda: fn(*fn_args), reps=20)

    configs = [None] + [slot_head.BlockConfig(n, bk, w, True, st) for n, bk, w, st in
                        ((16, 256, 4, 3), (32, 128, 4, 3), (32, 256, 4, 2), (32, 256, 4, 4), (32, 256, 8, 3),
                         (64, 128, 4, 3), (64, 256, 8, 3))]
    print("rows spread  torch  " + "  ".join("default" if c is None else f"{c.block_n}/{c.block_k}/{c.warps}/"
                                            f"{c.stages}" for c in configs))
    for m in (1, 2, 4, 8, 16):
        for spread in (False, True):
            hidden = torch.randn(m, k, device=device).bfloat16()
            slot = (torch.arange(m, device=device) % SLOTS_PER_FRAME) if spread else torch.full((m,), 3, device=device)
            times = [timed(reference, hidden, weight, AUDIO_START, slot, *args)]
            for config in configs:
                slot_head.forced = None if config is None else (lambda mm, kk, dt, c=config: c)
                times.append(timed(slot_head.slot_logits, hidden, weight, AUDIO_START, slot, *args))
            slot_head.forced = None
            print(f"{m:4d} {str(spread):6s} " + " ".join(f"{t:7.1f}" for t in times))


if __name__ == "__main__":
    globals()[f"check_{sys.argv[1]}"](*sys.argv[2:])
    print("ok")

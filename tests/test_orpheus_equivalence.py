"""Orpheus equivalence: our program vs the reference implementations on the same tiny random checkpoint.

The checkpoint is written by transformers' `LlamaForCausalLM.save_pretrained` and PyPI `snac`
(conftest.py). Greedy tokens must be identical; audio must match the reference SNAC decode of the
same frames within 1e-4 (float32 on CPU: observed ~1e-6).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from orpheus_helpers import make_program, run_requests

from vox_serve.models.orpheus.program import AUDIO_START, CODES_PER_SLOT, STOP_ID

AUDIO_TOL = 1e-4
TEXT = "Hello there, this is a test."


def reference_generate(ckpt: Path, prompt: list[int], max_new: int, constrain: bool,
                       repetition_penalty: float = 1.0) -> list[int]:
    from transformers import LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

    class OrpheusConstraint(LogitsProcessor):
        """The published audio layout as a mask: slot s of a frame takes ids base+4096*s.., stop at s=0."""

        def __call__(self, input_ids, scores):
            slot = (input_ids.shape[1] - len(prompt)) % 7
            mask = torch.full_like(scores, float("-inf"))
            lo = AUDIO_START + CODES_PER_SLOT * slot
            mask[:, lo : lo + CODES_PER_SLOT] = 0
            if slot == 0:
                mask[:, STOP_ID] = 0
            return scores + mask

    model = LlamaForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    processors = LogitsProcessorList([OrpheusConstraint()] if constrain else [])
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                         eos_token_id=STOP_ID, pad_token_id=0, logits_processor=processors,
                         repetition_penalty=repetition_penalty)
    gen = out[0, len(prompt):].tolist()
    return gen[:-1] if gen and gen[-1] == STOP_ID else gen


def reference_snac(ckpt: Path):
    from snac import SNAC, layers

    model = SNAC.from_pretrained(str(ckpt / "snac")).eval()
    for m in model.modules():
        if isinstance(m, layers.NoiseBlock):
            m.forward = lambda x: x  # our decoder without a noise seed adds none either
    return model


def reference_window_audio(ref, codes: list[int], first: int, frames: int) -> torch.Tensor:
    """Reference one-shot decode of frames [first, first + frames) in the Orpheus 7-slot order."""
    f = torch.tensor(codes[first * 7 : (first + frames) * 7]).view(1, frames, 7)
    levels = [f[:, :, 0], f[:, :, [1, 4]].reshape(1, -1), f[:, :, [2, 3, 5, 6]].reshape(1, -1)]
    with torch.no_grad():
        return ref.decode(levels)[0, 0]


@pytest.mark.parametrize("constrain", [False, True], ids=["raw", "audio-constrained"])
def test_greedy_tokens_match_transformers(tiny_orpheus_dir: Path, constrain: bool) -> None:
    """Two requests batched together; each equals transformers' greedy generate on its own.

    With the audio constraint, prompt ids are never candidates, so transformers' whole-sequence
    repetition penalty equals ours over a window that covers every generated token: the
    model's default 1.3 is compared too. Without it, both run with no penalty.
    """
    program, config = make_program(tiny_orpheus_dir, constrain=constrain)
    penalty = 1.3 if constrain else 1.0
    fields = [{"text": TEXT, "max_tokens": 40, "repetition_penalty": penalty},
              {"text": "Another, longer sentence for the batch.", "voice": "leo", "max_tokens": 40,
               "repetition_penalty": penalty}]
    reqs = run_requests(program, config, fields)
    assert program.meta.default_sampling["repetition_window"] >= 40
    for req in reqs:
        prompt = [row[0] for row in req.prompt.ids.tolist()]
        ours = [row[0] for row in req.tokens]
        ref = reference_generate(tiny_orpheus_dir, prompt, 40, constrain, penalty)
        assert ours == ref
        assert len(ours) > 0


def test_rope_dialects_load_identically(tiny_orpheus_dir: Path, tmp_path: Path) -> None:
    """config.json with transformers 4.x `rope_theta` + `rope_scaling` gives the same tokens as 5.x."""
    old = tmp_path / "ckpt-4x"
    shutil.copytree(tiny_orpheus_dir, old)
    cfg = json.loads((old / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params
    (old / "config.json").write_text(json.dumps(cfg))
    tokens = []
    for ckpt in (tiny_orpheus_dir, old):
        program, config = make_program(ckpt)
        tokens.append([row[0] for row in run_requests(program, config, [{"text": TEXT, "max_tokens": 21}])[0].tokens])
    assert tokens[0] == tokens[1]


@pytest.mark.parametrize("frames_per_chunk,num_frames", [(1, 9), (3, 9), (3, 8)])
def test_streamed_audio_matches_reference_windows(tiny_orpheus_dir: Path, frames_per_chunk: int,
                                                  num_frames: int) -> None:
    """Each streamed chunk equals the reference's one-shot decode of that chunk's window of frames.

    Published window: the frames [s, e) of a chunk decode with 1 frame before and 2 after; frame 0
    and the last 2 frames have no full window and are not emitted. A final short chunk (8 frames,
    3 per chunk) fills its window by repeating its last frame.
    """
    program, config = make_program(tiny_orpheus_dir, frames_per_chunk=frames_per_chunk)
    (req,) = run_requests(program, config, [{"text": TEXT, "max_tokens": 7 * num_frames, "ignore_eos": True}])
    assert req.num_codes == 7 * num_frames
    ref = reference_snac(tiny_orpheus_dir)
    expected = []
    for start in range(1, num_frames - 2, frames_per_chunk):
        end = min(start + frames_per_chunk, num_frames - 2)
        frames = [req.codes[f * 7 : (f + 1) * 7] for f in range(start - 1, end + 2)]
        frames += [frames[-1]] * (frames_per_chunk + 3 - len(frames))
        window = reference_window_audio(ref, sum(frames, []), 0, len(frames))
        expected.append(window[2048 : 2048 + (end - start) * 2048])
    assert len(req.extra["chunks"]) == len(expected)
    for got_bytes, want in zip(req.extra["chunks"], expected, strict=True):
        got = torch.frombuffer(bytearray(got_bytes), dtype=torch.int16).float() / 32767.0
        want_q = (want.clamp(-1, 1) * 32767.0).round() / 32767.0
        assert got.shape == want_q.shape
        assert (got - want_q).abs().max().item() <= AUDIO_TOL + 1.0 / 32767.0
        assert want_q.abs().max().item() > 1e-3  # not silence


def test_one_shot_codec_matches_reference(tiny_orpheus_dir: Path) -> None:
    """Our SNAC decoder over a whole utterance equals the reference's one-shot decode."""
    program, _ = make_program(tiny_orpheus_dir)
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 4096, (1, 12, 7), generator=gen)
    from vox_serve.codecs.snac import orpheus_frames_to_codes

    with torch.no_grad():
        ours = program.snac.decode(orpheus_frames_to_codes(codes))[0, 0]
    ref = reference_window_audio(reference_snac(tiny_orpheus_dir), codes.flatten().tolist(), 0, 12)
    rel = (ours - ref).norm() / ref.norm()
    assert rel.item() < AUDIO_TOL

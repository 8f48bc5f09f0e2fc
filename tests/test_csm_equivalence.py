"""CSM equivalence: our modules vs transformers' `CsmForConditionalGeneration` on the same tiny random checkpoint.

The checkpoint is written by `save_pretrained` (csm_helpers.write_tiny_csm); the reference generates greedily
through its public `generate` (backbone and depth decoder greedy), one request at a time, from prompts its
`CsmProcessor` builds (context clips encoded by its Mimi); we generate the same requests batched through our
loader, prompt builder, context encoder and an eager loop over our backbone (paged KV) and depth decoder.
Frames must be identical; audio must match the reference's `output_audio` within REF_RTOL.

Random weights never stop on their own: the stop cases zero the depth decoder's heads for codebooks 1..30
(their logits are all 0, so greedy picks code 0 on both sides) and scale the backbone's code-0 row, so that
the backbone's code 0 ends some requests mid-way. With the last head kept, the stop frame has a non-zero last
code (the reference keeps that frame's audio); with it zeroed too the frame is all-zero (the audio is cut
there).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from csm_helpers import (
    EagerGenerator,
    csm_tokenizer,
    reference_generate,
    reference_model,
    reference_processor,
    reference_text,
    wav_bytes,
)

from vox_serve.models.csm.context import encode_context
from vox_serve.models.csm.loader import load_csm_dir
from vox_serve.models.csm.prompt import PromptIds, audio_frame_count, build_prompt, parse_fields
from vox_serve.rt.checkpoint import CheckpointError

FRAMES = 8
REF_RTOL = 1e-5  # audio vs the reference's output_audio, float32 (observed ~7e-6)
TEXTS = [(0, "Hello there."), (1, "Another, longer sentence for the batch."), (2, "Short.")]
# Prompts (speaker, text) of the stop cases and the frames at which the reference stops (None: never within 24).
STOP_TEXTS = [(0, "Hello"), (1, "there friend"), (2, "friend what a"), (0, "it has been really short")]
STOP_FRAMES = 24

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def reference():  # noqa: ANN201
    return reference_processor()


def prompt_ids(tokenizer) -> PromptIds:  # noqa: ANN001
    return PromptIds.from_tokenizer(tokenizer, bos=128000, num_codebooks=32, codebook_size=2048, codebook_eos=0)


def our_frames(ckpt: Path, requests: list[dict], max_frames: int) -> list[list[list[int]]]:
    m = load_csm_dir(ckpt, 512)
    tok = csm_tokenizer()
    ids = prompt_ids(tok)
    prompts = [build_prompt(tok, ids, encode_context(m.codec_encoder, parse_fields(r, ids))) for r in requests]
    return EagerGenerator(m, max_rows=len(prompts)).generate(prompts, max_frames)


def test_greedy_frames_match_transformers(tiny_csm_dir: Path, reference) -> None:
    ours = our_frames(tiny_csm_dir, [{"text": t, "speaker": s} for s, t in TEXTS], FRAMES)
    model = reference_model(tiny_csm_dir)
    for (speaker, text), got in zip(TEXTS, ours, strict=True):
        want = reference_generate(model, reference, reference_text([(speaker, text, False)]), [], FRAMES)
        assert want.shape == (FRAMES, 32)
        assert torch.tensor(got).tolist() == want.tolist()
        assert len({tuple(f) for f in got}) == FRAMES  # not a degenerate repetition


def clip(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 24000)) / 24000
    return (0.4 * np.sin(2 * np.pi * (150 + 50 * seed) * t) + 0.1 * rng.standard_normal(t.size)).astype(np.float32)


def test_context_turns_match_transformers(tiny_csm_dir: Path, reference) -> None:
    """Context turns: a clip (encoded by our Mimi encoder), a text-only turn, codes given directly (the
    reference's encoding of its clip); the reference encodes both clips itself."""
    model = reference_model(tiny_csm_dir)
    a, b = clip(0.9, 1), clip(1.3, 2)  # 11.25 and 16.25 frames: off the frame grid
    with torch.no_grad():
        b_codes = model.codec_model.encode(torch.from_numpy(b)[None, None]).audio_codes[0].t().tolist()
    context = [{"text": "First turn.", "speaker": 1, "audio": wav_bytes(a)}, {"text": "No audio here.", "speaker": 0},
               {"text": "Third turn.", "speaker": 1, "codes": b_codes}]
    (got,) = our_frames(tiny_csm_dir, [{"text": "And now me.", "speaker": 0, "context": context}], FRAMES)
    text = reference_text([(1, "First turn.", True), (0, "No audio here.", False), (1, "Third turn.", True),
                           (0, "And now me.", False)])
    want = reference_generate(model, reference, text, [a, b], FRAMES)
    assert torch.tensor(got).tolist() == want.tolist()


def test_prompt_rows_match_the_processor(tiny_csm_dir: Path, reference) -> None:
    """Our rows are the processor's ids with each <|AUDIO|> replaced by its clip's frame, <|audio_eos|> by the
    all-zero frame; n = ceil(samples / 1920) audio positions per clip."""
    m = load_csm_dir(tiny_csm_dir, 64)
    tok = csm_tokenizer()
    ids = prompt_ids(tok)
    a = clip(0.5, 3)
    fields = parse_fields({"text": "Reply.", "speaker": 3, "context": [{"text": "Hi.", "speaker": 7,
                                                                        "audio": wav_bytes(a)}]}, ids)
    fields = encode_context(m.codec_encoder, fields)
    rows = build_prompt(tok, ids, fields)
    text_ids = reference(reference_text([(7, "Hi.", True), (3, "Reply.", False)]), audio=[a])["input_ids"][0]
    frames = iter(fields.context[0].codes)
    want = [list(next(frames)) + [-1] if t == 128002 else [0] * 32 + [-1] if t == 128003 else [-1] * 32 + [t]
            for t in text_ids.tolist()]
    assert rows == want
    assert len(fields.context[0].codes) == -(-a.size // 1920) == (text_ids == 128002).sum().item()


@pytest.mark.parametrize("case", ["last-code-kept", "all-zero"])
def test_stop_frame_and_audio_match_transformers(csm_stop_dirs, reference, case: str) -> None:
    ckpt = csm_stop_dirs[case]
    ours = our_frames(ckpt, [{"text": t, "speaker": s} for s, t in STOP_TEXTS], STOP_FRAMES)
    model, decoder = reference_model(ckpt), load_csm_dir(ckpt, 64).codec
    stopped = 0
    for (speaker, text), got in zip(STOP_TEXTS, ours, strict=True):
        inputs = reference(reference_text([(speaker, text, False)]))
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=STOP_FRAMES, do_sample=False,
                                 depth_decoder_do_sample=False, output_audio=True, return_dict_in_generate=True)
        assert torch.tensor(got).tolist() == out.sequences[0].tolist()
        ends = got[-1][:31] == [0] * 31
        stopped += ends
        count = audio_frame_count(got, 0)
        assert count == len(got) - (ends and case == "all-zero")
        want = out.audio[0]
        assert want.shape == (count * 1920,)
        if count:
            assert ((decoder.decode(torch.tensor([got[:count]]))[0] - want).norm() / want.norm()).item() < REF_RTOL
    assert 0 < stopped < len(STOP_TEXTS)  # the cases cover both endings
    assert any(1 < len(f) < STOP_FRAMES for f in ours)  # a stop mid-way, not only at the first frame


def test_rope_dialects_load_identically(tiny_csm_dir: Path, tmp_path: Path) -> None:
    """config.json in transformers 4.x form (`rope_theta` + `rope_scaling`) gives the same model as 5.x's
    `rope_parameters`; the tiny config uses llama3 scaling in the backbone and the depth decoder."""
    old = tmp_path / "ckpt-4x"
    shutil.copytree(tiny_csm_dir, old)
    cfg = json.loads((old / "config.json").read_text())
    for sub in (cfg, cfg["depth_decoder_config"], cfg["codec_config"]):
        params = sub.pop("rope_parameters")
        sub["rope_theta"] = params.pop("rope_theta")
        if params.get("rope_type") != "default":
            sub["rope_scaling"] = params
    assert cfg["rope_scaling"]["rope_type"] == "llama3"
    (old / "config.json").write_text(json.dumps(cfg))
    assert load_csm_dir(old, 64).config == load_csm_dir(tiny_csm_dir, 64).config
    request = [{"text": "Hello there.", "speaker": 0}]
    assert our_frames(old, request, 3) == our_frames(tiny_csm_dir, request, 3)


def test_loader_is_strict(tiny_csm_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(str(tiny_csm_dir / "model.safetensors"))
    cases = {"missing": ({k: v for k, v in sd.items() if k != "depth_decoder.model.norm.weight"},
                         "missing depth_decoder.model.norm.weight"),
             "unexpected": ({**sd, "codec_model.extra.weight": torch.zeros(1)}, "codec_model.extra.weight"),
             "mimi": ({k: v for k, v in sd.items() if "decoder_transformer.layers.1.mlp.fc1" not in k},
                      "decoder_transformer.layers.1.mlp.fc1.weight")}
    for name, (weights, message) in cases.items():
        bad = tmp_path / name
        shutil.copytree(tiny_csm_dir, bad)
        save_file(weights, str(bad / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(CheckpointError, match=message.replace(".", r"\.")):
            load_csm_dir(bad, 64)

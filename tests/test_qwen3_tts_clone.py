"""Qwen3-TTS Base (voice cloning) equivalence: our program vs PyPI qwen-tts on the same tiny random checkpoint.

The checkpoint (QWEN3_TTS_TINY_BASE_CONFIG: a tiny ECAPA speaker encoder, and the tiny 12 Hz codec whose
Mimi encoder the reference's builder perturbs) is written by the reference's `save_pretrained`. The
reference clones each voice through its public `create_voice_clone_prompt` + `generate_voice_clone`
(greedy, non_streaming_mode=True, which our requests ask for here; the default layout and audio:
test_qwen3_tts_clone_layouts.py), one request at a time; we run
the same requests batched through the real scheduler and worker, with the reference audio uploaded as
WAV bytes at 24 kHz (so resampling plays no part here; it has its own tests).
Checked: the speaker embedding (to float32 rounding), the codec encoder's codes (identical), the talker's
prompt embeddings (to float32 rounding) and the generated codes (identical) in both cloning modes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from qwen3_tts_helpers import (
    clone_reference,
    make_program,
    run_requests,
)

FRAMES = 24  # frames per request; the reference runs max_new_tokens = FRAMES + 1

# Our request fields per case; the reference's x_vector_only_mode is spelled out (it defaults to ICL).
CASES = [
    ({"text": "Hello, this is the test.", "language": "English", "ref_text": "A reference sentence."},
     "sine", False),
    ({"text": "你好, the test is here!", "ref_text": "Noise, and then some words."}, "noise", False),
    ({"text": "Another sentence; with more words in it."}, "chirp", True),  # no transcript: x-vector only
    ({"text": "Short.", "language": "Chinese", "ref_text": "ignored", "x_vector_only_mode": True}, "noise", True),
]


@pytest.fixture(scope="module")
def clone_setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes], list[dict]]:
    """(checkpoint, clips, per case: the reference's codes, prompt embeddings, speaker, reference codes)."""
    cases = [{"text": f["text"], "language": f.get("language"), "ref_text": f.get("ref_text"), "clip": clip,
              "x_vector_only_mode": xvec, "max_new_tokens": FRAMES + 1} for f, clip, xvec in CASES]
    return clone_reference(tmp_path_factory.mktemp("qwen3-tts-base"), cases)


def fields(i: int, wavs: dict[str, bytes]) -> dict:
    f, clip, _ = CASES[i]
    return {**f, "audio": wavs[clip], "max_tokens": FRAMES, "non_streaming_mode": True}


def test_speaker_embedding_matches_reference(clone_setup) -> None:
    ckpt, wavs, refs = clone_setup
    program, _ = make_program(ckpt)
    for i, ref in enumerate(refs):
        audio = program.cloner.reference_audio(fields(i, wavs)["audio"])
        ours = program.cloner.speaker_encoder(audio)
        torch.testing.assert_close(ours, ref["speaker"], rtol=1e-5, atol=1e-5)


def test_codec_encoder_codes_match_reference(clone_setup) -> None:
    ckpt, wavs, refs = clone_setup
    program, _ = make_program(ckpt)
    icl = [i for i, (_, _, xvec) in enumerate(CASES) if not xvec]
    for i in icl:
        audio = program.cloner.reference_audio(fields(i, wavs)["audio"])
        codes = program.cloner.codec_encoder(audio)
        assert codes.shape == (-(-audio.numel() // 1920), 4)
        assert codes.tolist() == refs[i]["ref_codes"].tolist()
        assert len(set(codes[:, 0].tolist())) > 1  # the codebooks are not degenerate


def test_prompt_embeddings_match_reference(clone_setup) -> None:
    """Our rows plus the speaker vector embed to the reference's talker input (both modes)."""
    ckpt, wavs, refs = clone_setup
    program, _ = make_program(ckpt)
    for i, ref in enumerate(refs):
        prompt = program.preprocess({k: v for k, v in fields(i, wavs).items() if k != "max_tokens"})
        (row, vector), = prompt.vectors.items()
        assert prompt.ids[row][:-1].tolist() == [-1] * 4  # the speaker position holds no code, only the vector
        with torch.no_grad():
            ours = program.talker.embed(torch.from_numpy(prompt.ids).long(), program.ids.tts_pad)
            ours[row] += torch.from_numpy(vector)
        assert ours.shape == ref["embeds"].shape
        torch.testing.assert_close(ours, ref["embeds"], rtol=1e-5, atol=1e-5)
        if not CASES[i][2]:  # in-context: the reference frames close the prompt, all code groups present
            frames = ref["ref_codes"].tolist()
            assert [r[:-1] for r in prompt.ids[-len(frames):].tolist()] == frames


def test_greedy_codes_match_reference_batched(clone_setup) -> None:
    ckpt, wavs, refs = clone_setup
    program, config = make_program(ckpt)
    reqs, _ = run_requests(program, config, [fields(i, wavs) for i in range(len(CASES))])
    for req, ref in zip(reqs, refs, strict=True):
        want = ref["codes"]
        assert torch.tensor(req.tokens).tolist() == want.tolist()
        assert req.finish_reason == ("stop" if len(want) < FRAMES else "length")

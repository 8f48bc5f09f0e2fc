"""Qwen3-TTS Base voice cloning in both prompt layouts, both modes, with and without input streaming, against
PyPI qwen-tts 0.1.1's `generate_voice_clone` (greedy): identical codes, and the reference's returned audio
(an in-context clone's decoded after the clip's codes, their audio cut off) within 1e-4 max abs and 60 dB SNR
in the streamed PCM16, at several chunkings, every policy and with async scheduling.

The tiny Base checkpoint and clips of test_qwen3_tts_clone.py (24 kHz WAV uploads). Our default layout is the
reference's default (`non_streaming_mode=False`: the text fed one token per frame); the transcript and the
text pair with the clip's frames, ids left over trail (the cases cover the transcript alone outnumbering the
frames, the text running out before them, and trailing text ids).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from qwen3_tts_helpers import StreamingDriver, clone_reference, make_program, run_requests

from vox_serve import ipc
from vox_serve.core.meta import CODEC_PREFIX
from vox_serve.voice_prompt import SAVED_VOICE_FIELD

FRAMES = 24  # frames per request; the reference runs max_new_tokens = FRAMES + 1
MAX_ABS = 1e-4  # the brief's bounds on the streamed audio vs the reference's
MIN_SNR_DB = 60.0
LONG_REF = "A transcript with more tokens than its clip has frames."  # 56 ids, the chirp clip 19 frames

# name -> (request fields without the clip, clip, reference's x_vector_only_mode, non_streaming_mode)
CASES = {
    "icl": ({"text": "Hello, this is the test.", "language": "English", "ref_text": "A reference sentence."},
            "sine", False, False),  # 31 text ids, 30 codec rows: one trails
    "icl_non_streaming": ({"text": "Hello, this is the test.", "language": "English",
                           "ref_text": "A reference sentence.", "non_streaming_mode": True}, "sine", False, True),
    "icl_long_transcript": ({"text": "Short.", "ref_text": LONG_REF}, "chirp", False, False),
    "icl_short": ({"text": "Hi.", "ref_text": "Ok."}, "noise", False, False),  # tts_pad after the text
    "xvec": ({"text": "Another sentence; with more words in it."}, "chirp", True, False),
    "xvec_non_streaming": ({"text": "Another sentence; with more words in it.", "non_streaming_mode": True},
                           "chirp", True, True),
}
NAMES = list(CASES)
ICL = [n for n in NAMES if not CASES[n][2]]


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes], dict[str, dict]]:
    cases = [{"text": f["text"], "language": f.get("language"), "ref_text": f.get("ref_text"), "clip": clip,
              "x_vector_only_mode": xvec, "non_streaming_mode": nsm, "max_new_tokens": FRAMES + 1}
             for f, clip, xvec, nsm in CASES.values()]
    ckpt, wavs, refs = clone_reference(tmp_path_factory.mktemp("qwen3-tts-clone-layouts"), cases)
    return ckpt, wavs, dict(zip(NAMES, refs, strict=True))


def request_fields(name: str, wavs: dict[str, bytes]) -> dict:
    fields, clip, _, _ = CASES[name]
    return {**fields, "audio": wavs[clip], "max_tokens": FRAMES}


def pcm(chunks: list[bytes]) -> torch.Tensor:
    return torch.cat([torch.frombuffer(bytearray(c), dtype=torch.int16) for c in chunks]).float() / 32767.0


def assert_audio_matches(ours: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """The reference cuts int(ref_len / total_len * samples) samples, which float rounding can make one short
    of the clip's frames: compare the ends."""
    assert abs(ours.numel() - want.numel()) <= 1, (name, ours.numel(), want.numel())
    n = min(ours.numel(), want.numel())
    ours, want = ours[-n:].double(), want[-n:].double()
    err = (ours - want).abs().max().item()
    snr = 10 * math.log10(want.pow(2).sum().item() / max((ours - want).pow(2).sum().item(), 1e-30))
    assert err <= MAX_ABS and snr >= MIN_SNR_DB, (name, err, snr)


def check(reqs: list, names: list[str], refs: dict[str, dict]) -> None:
    for req, name in zip(reqs, names, strict=True):
        assert req.tokens == refs[name]["codes"].tolist(), name
        assert_audio_matches(pcm(req.extra["chunks"]), refs[name]["audio"], name)


def test_prompts_embed_like_the_reference(ref) -> None:
    ckpt, wavs, refs = ref
    program, _ = make_program(ckpt)
    for name in NAMES:
        fields = {k: v for k, v in request_fields(name, wavs).items() if k != "max_tokens"}
        prompt = program.preprocess(fields)
        (row, vector), = prompt.vectors.items()
        with torch.no_grad():
            ours = program.talker.embed(torch.from_numpy(prompt.ids).long(), program.ids.tts_pad)
            ours[row] += torch.from_numpy(vector)
        torch.testing.assert_close(ours, refs[name]["embeds"], rtol=1e-5, atol=1e-5, msg=name)
        in_context = name in ICL
        assert (CODEC_PREFIX in prompt.conditioning) == in_context
        if in_context:
            assert prompt.conditioning[CODEC_PREFIX].tolist() == refs[name]["ref_codes"].tolist()
    assert len(program.preprocess(request_fields("icl_long_transcript", wavs)).trailing_text) > 6  # transcript ids


def test_default_layout_is_the_references_default(ref) -> None:
    ckpt, wavs, _ = ref
    program, _ = make_program(ckpt)
    fields = {k: v for k, v in request_fields("icl", wavs).items() if k != "max_tokens"}
    default = program.preprocess(fields)
    explicit = program.preprocess({**fields, "non_streaming_mode": False})
    other = program.preprocess({**fields, "non_streaming_mode": True})
    assert default.ids.tolist() == explicit.ids.tolist() and default.trailing_text == explicit.trailing_text
    assert default.ids.shape[0] < other.ids.shape[0] and not other.trailing_text


@pytest.mark.parametrize("frames_per_chunk,first_chunk_frames,async_scheduling", [
    (None, None, False), (1, None, False), (7, 2, False), (4, 3, True)])
def test_codes_and_audio_match_the_reference(ref, frames_per_chunk, first_chunk_frames, async_scheduling) -> None:
    """All cases batched through the real scheduler and worker."""
    ckpt, wavs, refs = ref
    program, config = make_program(ckpt, frames_per_chunk=frames_per_chunk)
    config = dataclasses.replace(config, scheduler=dataclasses.replace(
        config.scheduler, first_chunk_frames=first_chunk_frames, async_scheduling=async_scheduling))
    reqs, _ = run_requests(program, config, [request_fields(n, wavs) for n in NAMES],
                           async_scheduling=async_scheduling)
    check(reqs, NAMES, refs)


@pytest.mark.parametrize("policy", ["base", "online", "offline", "deadline"])
def test_every_policy(ref, policy: str) -> None:
    ckpt, wavs, refs = ref
    program, config = make_program(ckpt, frames_per_chunk=5)
    driver = StreamingDriver(program, config, policy=policy)
    names = ["icl", "icl_short", "xvec"]
    for i, name in enumerate(names):
        driver.service.handle(ipc.Submit(f"r{i}", {k: v for k, v in request_fields(name, wavs).items()
                                                   if k != "audio"}, 0, audio=wavs[CASES[name][1]]))
    driver.finish()
    for i, name in enumerate(names):
        assert [m.req_id for m in driver.events(f"r{i}", ipc.Failed)] == []
        assert_audio_matches(pcm([m.pcm for m in driver.events(f"r{i}", ipc.Audio)]), refs[name]["audio"], name)


def test_in_context_input_streaming_matches_the_reference(ref) -> None:
    """Text in pieces: a session starts once the ids its prompt pairs with the clip's frames have arrived (or its
    text has ended), and the rest is fed as it arrives; codes and audio are the whole text's reference ones."""
    ckpt, wavs, refs = ref
    program, config = make_program(ckpt, frames_per_chunk=3)
    driver = StreamingDriver(program, config)
    names = ["icl", "icl_long_transcript", "icl_short", "xvec"]
    for i, name in enumerate(names):
        fields = {k: v for k, v in request_fields(name, wavs).items() if k not in ("audio", "text")}
        driver.start(f"s{i}", fields, wavs[CASES[name][1]])
    texts = [CASES[n][0]["text"] for n in names]
    cut = 9  # "Hello, th", "Short.", "Hi.", "Another s": the last word is held back until more text comes
    for i, text in enumerate(texts):
        driver.text(f"s{i}", text[:cut])
    driver.steps(3)
    # "icl" needs 9 ids (30 codec rows, 21 transcript ids), more than "Hello, " gives; "icl_short" needs more
    # than its whole text has (it starts at the end); the long transcript outnumbers its clip's frames (that
    # session starts at once); x-vector needs one id.
    started = [driver.service.sessions[f"s{i}"].started for i in range(len(names))]
    assert started == [False, True, False, True]
    for i, text in enumerate(texts):
        driver.text(f"s{i}", text[cut:])
        driver.steps(2)
    for i in range(len(texts)):
        driver.end(f"s{i}")
    driver.finish()
    for i, name in enumerate(names):
        req = driver.reqs[f"s{i}"]
        assert req.tokens == refs[name]["codes"].tolist(), name
        assert_audio_matches(pcm([m.pcm for m in driver.events(f"s{i}", ipc.Audio)]), refs[name]["audio"], name)


def test_input_streaming_refuses_the_non_streaming_layout(ref) -> None:
    ckpt, wavs, _ = ref
    program, config = make_program(ckpt)
    driver = StreamingDriver(program, config)
    driver.start("s", {"ref_text": "A clip.", "non_streaming_mode": True}, wavs["sine"])
    (failed,) = driver.events("s", ipc.Failed)
    assert failed.field == "non_streaming_mode"


def test_a_saved_voice_gives_the_uploads_prompt(ref) -> None:
    """Saved with its transcript, a voice brings the reference codes: the same prompt, codec prefix included."""
    ckpt, wavs, _ = ref
    program, _ = make_program(ckpt)
    for name in ("icl", "icl_non_streaming", "xvec"):
        fields = {k: v for k, v in request_fields(name, wavs).items() if k != "max_tokens"}
        upload = program.preprocess(fields)
        voice = program.encode_voice(fields.pop("audio"), None if name == "xvec" else fields.pop("ref_text"))
        saved = program.preprocess({**fields, SAVED_VOICE_FIELD: voice})
        assert saved.ids.tolist() == upload.ids.tolist() and saved.trailing_text == upload.trailing_text
        assert {k: v.tolist() for k, v in saved.conditioning.items()} == \
            {k: v.tolist() for k, v in upload.conditioning.items()}
        torch.testing.assert_close(torch.from_numpy(next(iter(saved.vectors.values()))),
                                   torch.from_numpy(next(iter(upload.vectors.values()))))

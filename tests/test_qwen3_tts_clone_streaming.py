"""Qwen3-TTS Base input streaming: a voice cloned from its speaker embedding (x-vector only), with the text
arriving in pieces, gives the reference's greedy codes for the whole text in its streaming text mode
(`generate_voice_clone(..., x_vector_only_mode=True, non_streaming_mode=False)`); a session that cannot clone
is refused when it opens, naming the field. In-context input streaming: test_qwen3_tts_clone_layouts.py.

The tiny Base checkpoint and reference clips of test_qwen3_tts_clone.py; our side runs through the
scheduler process's message handling (StreamingDriver), the clip uploaded as 24 kHz WAV bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from qwen3_tts_helpers import (
    StreamingDriver,
    clone_reference,
    make_program,
    reference_wavs,
)

from tests.engine_helpers import build_program
from vox_serve import ipc
from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig

FRAMES = 48  # longer than the texts: frames past the text get tts_eos, then tts_pad
DRY_STEPS = 40  # more steps than a text has tokens: the text runs dry
# Session fields and clip per case: no transcript, and one that x_vector_only_mode sets aside.
CASES = [
    ({"language": "English"}, "Hello, this is the test.", "sine"),
    ({"ref_text": "Set aside.", "x_vector_only_mode": True}, "你好, the test is here!", "chirp"),
]


@pytest.fixture(scope="module")
def clone_setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes], list[dict]]:
    """(checkpoint, clips, per case: the reference's codes and talker prompt embeddings)."""
    cases = [{"text": text, "language": f.get("language"), "ref_text": f.get("ref_text"), "clip": clip,
              "x_vector_only_mode": True, "non_streaming_mode": False, "max_new_tokens": FRAMES + 1}
             for f, text, clip in CASES]
    return clone_reference(tmp_path_factory.mktemp("qwen3-tts-base-stream"), cases)


def session_fields(i: int) -> dict:
    return {**CASES[i][0], "max_tokens": FRAMES}


def test_streaming_clone_prompt_embeds_like_the_reference(clone_setup) -> None:
    """The first text token with codec_bos closes the prompt; the speaker vector sits in the speaker slot."""
    ckpt, wavs, refs = clone_setup
    program, _ = make_program(ckpt)
    for i, ref in enumerate(refs):
        ids, _ = program.stable_text_ids(CASES[i][1], 0, True)
        fields = {**session_fields(i), "audio": wavs[CASES[i][2]]}
        prompt = program.preprocess_streaming(fields, ids[: program.num_prompt_text_ids])
        (row, vector), = prompt.vectors.items()
        with torch.no_grad():
            ours = program.talker.embed(torch.from_numpy(prompt.ids).long(), program.ids.tts_pad)
            ours[row] += torch.from_numpy(vector)
        torch.testing.assert_close(ours, ref["embeds"], rtol=1e-5, atol=1e-5)


def test_streamed_clone_text_gives_the_reference_codes(clone_setup) -> None:
    """Both sessions in one batch, text in pieces between steps; the first one's text runs dry for a while."""
    ckpt, wavs, refs = clone_setup
    program, config = make_program(ckpt)
    driver = StreamingDriver(program, config)
    for i, (_, _, clip) in enumerate(CASES):
        driver.start(f"s{i}", session_fields(i), wavs[clip])
    texts = [text for _, text, _ in CASES]
    driver.text("s0", texts[0][:9])  # "Hello, th": "th" waits for more letters
    driver.text("s1", texts[1])
    driver.end("s1")
    driver.steps(DRY_STEPS)
    dry = driver.reqs["s0"]
    assert driver.scheduler.num_waiting_for_text == 1 and dry.num_generated == len(dry.text_feed.ids) + 1
    driver.text("s0", texts[0][9:])
    driver.steps(2)
    driver.end("s0")
    driver.finish()
    for i, ref in enumerate(refs):
        req, want = driver.reqs[f"s{i}"], ref["codes"]
        assert req.tokens == want.tolist()
        assert req.finish_reason == ("stop" if len(want) < FRAMES else "length")
        assert len(driver.events(f"s{i}", ipc.Finished)) == 1
    assert all(free == total for free, total in driver.service.pools().values())


@pytest.fixture(scope="module")
def tiny_base():
    config = VoxConfig(model=ModelConfig(model="qwen3-tts-base-tiny", device="cpu"),
                       cache=CacheConfig(page_size=16, max_num_pages=64),
                       scheduler=SchedulerConfig(max_batch_size=4, max_prefill_tokens=256))
    return build_program(config), config


@pytest.mark.parametrize("fields,field", [
    ({"x_vector_only_mode": False}, "ref_text"),  # in context without a transcript
    ({"ref_text": "A clip.", "non_streaming_mode": True}, "non_streaming_mode"),  # the text is not all there
    ({"language": "english"}, "audio"),  # nothing to clone
])
def test_a_session_that_cannot_clone_is_refused_at_its_start(tiny_base, fields: dict, field: str) -> None:
    program, config = tiny_base
    assert program.meta.supports_input_streaming and program.meta.streamed_text_column == program.num_groups
    driver = StreamingDriver(program, config)
    driver.start("s", fields, b"" if field == "audio" else reference_wavs()["sine"])
    (failed,) = driver.events("s", ipc.Failed)
    assert failed.code == ipc.ErrorCode.INVALID_FIELD and failed.field == field
    assert not driver.events("s", ipc.Started) and not driver.service.sessions

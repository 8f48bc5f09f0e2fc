"""Qwen3-TTS input streaming vs the reference: text sent in pieces gives the reference's greedy codes
for the whole text in its streaming text mode (`generate_custom_voice(..., non_streaming_mode=False)`:
the prompt holds the first text token, generated frame k adds trailing text token k).

The same tiny checkpoint as test_qwen3_tts_equivalence.py, written by the reference. Our side runs
through the scheduler process's message handling (sessions, the scheduler, the worker), with the
text arriving at once, in pieces between steps, or with a pause long enough for the text to run dry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from qwen3_tts_helpers import (
    StreamingDriver,
    case_fields,
    count_preemptions,
    make_program,
    require_reference,
    run_reference,
    voice_design_copy,
    write_tiny_checkpoint,
)

from vox_serve import ipc

FRAMES = 48  # longer than every text here: frames past the text get tts_eos, then tts_pad
CASES = [
    {"kind": "custom_voice", "text": "Hello, this is the test.", "speaker": "Ryan", "language": "English"},
    {"kind": "custom_voice", "text": "Another sentence; with more words in it.", "speaker": "vivian",
     "instruct": "Happy."},
    {"kind": "voice_design", "text": "你好, the test is here!", "instruct": "A bright young voice."},
    {"kind": "custom_voice", "text": "Hello, this is the test.", "speaker": "eric", "language": "Chinese",
     "eos_scale": 2.0},  # stops on its own
]
DRY_STEPS = 60  # more steps than any text has tokens: the text runs dry


def pieces(text: str) -> list[str]:
    """Four pieces, cut inside words."""
    cuts = [0, 3, len(text) // 2 + 1, len(text) - 2, len(text)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    require_reference()
    root = tmp_path_factory.mktemp("qwen3-tts-stream")
    custom = write_tiny_checkpoint(root / "custom")
    return {"custom_voice": custom, "voice_design": voice_design_copy(custom, root / "design")}


@pytest.fixture(scope="module")
def reference(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Per case: the reference's codes [frames, G] and talker prompt embeddings, streaming text mode."""
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("qwen3-tts-stream-ref")
    cases = [{**c, "ckpt": str(checkpoints[c["kind"]]), "max_new_tokens": FRAMES + 1, "non_streaming_mode": False}
             for c in CASES]
    (out / "cases.json").write_text(json.dumps(cases))
    run_reference("generate", out / "cases.json", out)
    tensors = load_file(out / "reference.safetensors")
    return [{"codes": tensors[f"{n}.codes"], "embeds": tensors[f"{n}.embeds"]} for n in range(len(cases))]


def programs(checkpoints: dict[str, Path]) -> dict[tuple[str, float], tuple]:
    return {(c["kind"], c.get("eos_scale", 1.0)): make_program(checkpoints[c["kind"]], c.get("eos_scale", 1.0))
            for c in CASES}


def session_fields(case: dict) -> dict:
    return {k: v for k, v in case_fields(case, FRAMES).items() if k != "text"}


def check_codes(driver: StreamingDriver, req_id: str, ref: dict) -> None:
    req = driver.reqs[req_id]
    want = ref["codes"]
    assert req.tokens == want.tolist()
    assert req.finish_reason == ("stop" if len(want) < FRAMES else "length")
    assert len(driver.events(req_id, ipc.Finished)) == 1


@pytest.mark.parametrize("how", ["whole", "pieces", "pieces-async-online", "pieces-deadline"])
def test_streamed_text_gives_the_reference_codes(checkpoints, reference, how: str) -> None:
    """All cases at once in one batch; the text whole in the first message, or in pieces between steps."""
    policy, run_async = {"whole": ("base", False), "pieces": ("base", False),
                         "pieces-async-online": ("online", True), "pieces-deadline": ("deadline", False)}[how]
    by_program = programs(checkpoints)
    for key, (program, config) in by_program.items():
        driver = StreamingDriver(program, config, policy, run_async)
        mine = [(i, c) for i, c in enumerate(CASES) if (c["kind"], c.get("eos_scale", 1.0)) == key]
        for i, case in mine:
            driver.start(f"s{i}", session_fields(case))
        parts = {i: [case["text"]] if how == "whole" else pieces(case["text"]) for i, case in mine}
        for n in range(max(len(p) for p in parts.values())):
            for i, _ in mine:
                if n < len(parts[i]):
                    driver.text(f"s{i}", parts[i][n])
            driver.steps(2)
        for i, _ in mine:
            driver.end(f"s{i}")
        driver.finish()
        for i, _ in mine:
            check_codes(driver, f"s{i}", reference[i])
        assert all(free == total for free, total in driver.service.pools().values())


def test_a_request_whose_text_runs_dry_waits_then_resumes_with_the_same_codes(checkpoints, reference) -> None:
    """While its text has run dry the request waits (one frame per text id received, plus the prompt's),
    and the request next to it, whose text is complete, keeps generating."""
    program, config = make_program(checkpoints["custom_voice"])
    driver = StreamingDriver(program, config)
    dry, full = CASES[0], CASES[1]
    driver.start("dry", session_fields(dry))
    driver.start("full", session_fields(full))
    driver.text("full", full["text"])
    driver.end("full")
    first, rest = dry["text"][:9], dry["text"][9:]  # "Hello, th": "th" waits for more letters
    driver.text("dry", first)
    driver.steps(DRY_STEPS // 2)
    req, other = driver.reqs["dry"], driver.reqs["full"]
    fed = len(req.text_feed.ids)
    assert 0 < fed < len(first) and req.num_generated == fed + 1  # the prompt's text id, then one per frame
    assert driver.scheduler.num_waiting_for_text == 1
    before = other.num_generated
    driver.steps(DRY_STEPS // 2)
    assert req.num_generated == fed + 1 and other.num_generated > before
    assert driver.service.pools()["kv_pages"][0] < driver.service.pools()["kv_pages"][1]  # pages kept
    driver.text("dry", rest)
    driver.steps(DRY_STEPS)
    assert req.num_generated == len(req.text_feed.ids) + 1  # dry again: "test." waits for the end
    driver.end("dry")
    driver.finish()
    check_codes(driver, "dry", reference[0])
    check_codes(driver, "full", reference[1])


def test_streaming_prompt_embeds_like_the_reference(checkpoints, reference) -> None:
    for case, ref in zip(CASES[:3], reference[:3], strict=True):
        program, _ = make_program(checkpoints[case["kind"]])
        ids, _ = program.stable_text_ids(case["text"], 0, True)
        rows = program.preprocess_streaming(session_fields(case), ids[: program.num_prompt_text_ids]).ids.tolist()
        with torch.no_grad():
            ours = program.talker.embed(torch.tensor(rows), program.ids.tts_pad)
        torch.testing.assert_close(ours, ref["embeds"], rtol=1e-5, atol=1e-5)


def test_preempted_streaming_requests_recompute_their_text_and_give_the_same_codes(checkpoints, reference,
                                                                                   monkeypatch) -> None:
    """A KV pool too small for both requests: preempted ones re-prefill their generated frames with the
    text ids those frames were fed (asynchronous scheduling, text in pieces with a dry pause)."""
    preempted = count_preemptions(monkeypatch)
    program, config = make_program(checkpoints["custom_voice"], max_num_pages=7)
    driver = StreamingDriver(program, config, async_scheduling=True)
    for i in (0, 1):
        driver.start(f"s{i}", session_fields(CASES[i]))
    for n in range(4):
        for i in (0, 1):
            driver.text(f"s{i}", pieces(CASES[i]["text"])[n])
        driver.steps(DRY_STEPS if n == 1 else 2)
    for i in (0, 1):
        driver.end(f"s{i}")
    driver.finish()
    assert preempted, "the small KV pool should have forced a preemption"
    for i in (0, 1):
        check_codes(driver, f"s{i}", reference[i])


def test_whole_text_in_the_streaming_layout_gives_the_reference_codes(checkpoints, reference) -> None:
    """POST /generate's `non_streaming_mode=false` (CustomVoice / VoiceDesign default to true): the text trails
    one token per frame from the start, the same codes as the reference's streaming text mode."""
    from qwen3_tts_helpers import run_requests

    for (kind, eos_scale), (program, config) in programs(checkpoints).items():
        index = [i for i, c in enumerate(CASES) if (c["kind"], c.get("eos_scale", 1.0)) == (kind, eos_scale)]
        fields = [{**case_fields(CASES[i], FRAMES), "non_streaming_mode": False} for i in index]
        reqs, _ = run_requests(program, config, fields)
        for req, i in zip(reqs, index, strict=True):
            assert req.tokens == reference[i]["codes"].tolist(), CASES[i]
            assert req.prompt_len == reference[i]["embeds"].shape[0]

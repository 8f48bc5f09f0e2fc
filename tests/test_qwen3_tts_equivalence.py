"""Qwen3-TTS equivalence: our program vs PyPI qwen-tts on the same tiny random checkpoint.

The checkpoint (QWEN3_TTS_TINY_CONFIG: real codec and text vocabularies, 4 code groups) is written
by the reference's `save_pretrained`; the reference generates greedily through its public
`generate_custom_voice` / `generate_voice_design` (non-streaming text mode, its default), one request
at a time; we run the same requests batched through the real scheduler and worker. Codes must be
identical frame for frame (the reference's default repetition penalty 1.05 included); the talker's
prompt embeddings must match to float32 rounding. Random weights rarely stop, so some cases scale the
EOS row of the codec head (on both sides) to make the model stop early, or as early as allowed (which
checks the reference's `min_new_tokens=2`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from qwen3_tts_helpers import (
    case_fields,
    count_preemptions,
    make_program,
    require_reference,
    run_reference,
    run_requests,
    voice_design_copy,
    write_tiny_checkpoint,
)

from vox_serve.models.qwen3_tts.loader import QWEN3_TTS_TINY_CONFIG
from vox_serve.models.qwen3_tts.prompt import PromptIds, build_prompt
from vox_serve.models.tokenizers.qwen2 import load_qwen2_tokenizer, save_tokenizer_files, tiny_qwen2_tokenizer

FRAMES = 40  # frames per request; the reference runs max_new_tokens = FRAMES + 1
PROMPTS = [
    {"kind": "custom_voice", "text": "Hello, this is the test.", "speaker": "Ryan", "language": "English"},
    {"kind": "custom_voice", "text": "你好, the test is here!", "speaker": "eric", "language": "Chinese",
     "instruct": "Speak slowly."},  # a dialect speaker: Chinese becomes his dialect's language id
    {"kind": "custom_voice", "text": "Another sentence; with more words in it.", "speaker": "vivian",
     "instruct": "Happy."},  # language auto: the nothink prefix
    {"kind": "custom_voice", "text": "Short.", "speaker": "ryan", "language": "japanese"},
]
DESIGN = [
    {"kind": "voice_design", "text": "Hello, this is the test.", "language": "English",
     "instruct": "A calm, deep voice."},
    {"kind": "voice_design", "text": "你好, the test is here!", "instruct": "A bright young voice."},
]
# group -> (checkpoint, EOS row scale, prompts). x2 stops some requests mid-way; with x-5 EOS is the
# argmax of the first frames (these requests would stop at once), so they stop as soon as the
# reference allows (min_new_tokens=2: the third frame) or one frame later.
# "same-width": the 0.6B layout, where the predictor is as wide as the talker (no input projection).
GROUPS = {"plain": ("custom", 1.0, PROMPTS), "eos-x2": ("custom", 2.0, PROMPTS),
          "eos-x-5": ("custom", -5.0, PROMPTS[:2]), "voice-design": ("design", 1.0, DESIGN),
          "same-width": ("same-width", 1.0, [PROMPTS[0], PROMPTS[3]])}
SAME_WIDTH = {**QWEN3_TTS_TINY_CONFIG, "tts_model_size": "0b6",
              "talker_config": {**QWEN3_TTS_TINY_CONFIG["talker_config"], "hidden_size": 32, "head_dim": 8}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    require_reference()
    root = tmp_path_factory.mktemp("qwen3-tts")
    custom = write_tiny_checkpoint(root / "custom")
    return {"custom": custom, "design": voice_design_copy(custom, root / "design"),
            "same-width": write_tiny_checkpoint(root / "same-width", SAME_WIDTH, seed=3)}


@pytest.fixture(scope="module")
def reference(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """group -> per case: codes [frames, G], prompt embeddings [T, H], tokenized ids."""
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("qwen3-tts-ref")
    cases, where = [], []
    for group, (ckpt, scale, prompts) in GROUPS.items():
        for i, prompt in enumerate(prompts):
            cases.append({**prompt, "ckpt": str(checkpoints[ckpt]), "eos_scale": scale, "max_new_tokens": FRAMES + 1})
            where.append((group, i))
    (out / "cases.json").write_text(json.dumps(cases))
    run_reference("generate", out / "cases.json", out)
    tensors = load_file(out / "reference.safetensors")
    ids = json.loads((out / "reference.json").read_text())
    results: dict[str, list[dict]] = {group: [] for group in GROUPS}
    for n, (group, _) in enumerate(where):
        results[group].append({"codes": tensors[f"{n}.codes"], "embeds": tensors[f"{n}.embeds"], **ids[n]})
    return results


@pytest.mark.parametrize("group", list(GROUPS))
def test_greedy_codes_match_reference(checkpoints, reference, group: str) -> None:
    ckpt, scale, prompts = GROUPS[group]
    program, config = make_program(checkpoints[ckpt], eos_scale=scale)
    reqs, _ = run_requests(program, config, [case_fields(p, FRAMES) for p in prompts])
    for req, ref in zip(reqs, reference[group], strict=True):
        want = ref["codes"]
        assert torch.tensor(req.tokens).tolist() == want.tolist()
        assert req.finish_reason == ("stop" if len(want) < FRAMES else "length")
    stopped = [r.num_generated for r in reqs if r.finish_reason == "stop"]
    if group == "eos-x2":
        assert stopped and len(stopped) < len(reqs)  # the group covers both endings
    if group == "eos-x-5":
        assert len(stopped) == len(reqs) and min(stopped) == 2


def test_codes_match_with_async_scheduling_and_preemption(checkpoints, reference, monkeypatch) -> None:
    """Pending inputs (patched into the leading input columns on the device) and preempted requests
    re-prefilling their generated frames (rows padded with absent ids: text = tts_pad) give the same codes."""
    preempted = count_preemptions(monkeypatch)
    program, config = make_program(checkpoints["custom"], max_num_pages=14)
    reqs, _ = run_requests(program, config, [case_fields(p, FRAMES) for p in PROMPTS], async_scheduling=True)
    assert preempted, "the small KV pool should have forced a preemption"
    for req, ref in zip(reqs, reference["plain"], strict=True):
        assert torch.tensor(req.tokens).tolist() == ref["codes"].tolist()


def test_prompt_matches_reference(checkpoints, reference) -> None:
    """Our prompt rows embed to the reference's talker input, and tokenize its chat strings identically."""
    for group, (ckpt, _, prompts) in GROUPS.items():
        program, _ = make_program(checkpoints[ckpt])
        for prompt, ref in zip(prompts, reference[group], strict=True):
            fields = {k: v for k, v in case_fields(prompt, FRAMES).items() if k != "max_tokens"}
            rows = program.preprocess(fields).ids.tolist()
            text = [r[-1] for r in rows]
            assert ref["input_ids"][3:-5] == text[-len(ref["input_ids"][3:-5]) - 2: -2]
            if ref["instruct_ids"] is not None:
                assert text[: len(ref["instruct_ids"])] == ref["instruct_ids"]
            with torch.no_grad():
                ours = program.talker.embed(torch.tensor(rows), program.ids.tts_pad)
            assert ours.shape == ref["embeds"].shape
            torch.testing.assert_close(ours, ref["embeds"], rtol=1e-5, atol=1e-5)


def test_streamed_audio_equals_one_shot_decode(checkpoints) -> None:
    """Chunks of 4 frames through the codec slots equal one decode of all frames (the codec is causal)."""
    program, config = make_program(checkpoints["custom"], frames_per_chunk=4)
    (req,) = run_requests(program, config, [case_fields(PROMPTS[0], 10)])[0]
    pcm = torch.cat([torch.frombuffer(bytearray(c), dtype=torch.int16) for c in req.extra["chunks"]])
    assert pcm.numel() == 10 * program.meta.samples_per_frame
    with torch.no_grad():
        whole = program.codec_decoder.decode(torch.tensor(req.tokens)[None])[0]
    want = (whole.clamp(-1, 1) * 32767.0).round()
    assert (pcm.float() - want).abs().max().item() <= 1.0


def test_slow_tokenizer_files_match_transformers(tmp_path: Path) -> None:
    """vocab.json + merges.txt rebuilt by us == transformers' Qwen2TokenizerFast built from the same files."""
    save_tokenizer_files(tiny_qwen2_tokenizer(contiguous_specials=True), tmp_path, fast=False)
    strings = ["<|im_start|>assistant\nHello, this is the test. 你好!<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\n  Speak\tslowly...  it's 42 o'clock\r\n<|im_end|>\n", "Ünïcödé café e\u0301"]
    (tmp_path / "strings.json").write_text(json.dumps(strings))
    run_reference("tokenize", tmp_path, tmp_path / "strings.json", tmp_path / "ids.json")
    ours = load_qwen2_tokenizer(tmp_path)
    assert [ours.encode(s).ids for s in strings] == json.loads((tmp_path / "ids.json").read_text())


def test_tokenizer_json_and_slow_files_agree(tmp_path: Path) -> None:
    save_tokenizer_files(tiny_qwen2_tokenizer(), tmp_path / "fast")
    save_tokenizer_files(tiny_qwen2_tokenizer(), tmp_path / "slow", fast=False)
    s = "<|im_start|>assistant\nHello, the test!<|im_end|>\n"
    fast, slow = load_qwen2_tokenizer(tmp_path / "fast"), load_qwen2_tokenizer(tmp_path / "slow")
    assert fast.encode(s).ids == slow.encode(s).ids
    assert fast.encode(s).ids[0] == 151644


def _ids(**overrides) -> PromptIds:
    return PromptIds.from_config({**QWEN3_TTS_TINY_CONFIG, **overrides})


def test_prompt_rules() -> None:
    tok = tiny_qwen2_tokenizer()
    ids = _ids()
    rows = build_prompt(tok, ids, "Hi.", "Eric", "auto")  # a dialect speaker with language auto
    assert [r[0] for r in rows[3:8]] == [ids.codec_think, ids.codec_think_bos, 2062, ids.codec_think_eos, 2875]
    rows = build_prompt(tok, ids, "Hi.", "eric", "English")
    assert rows[5][0] == 2050
    assert rows[-1] == [ids.codec_bos, -1, -1, -1, ids.tts_pad]
    with pytest.raises(ValueError, match="voice 'nobody'"):
        build_prompt(tok, ids, "Hi.", "nobody")
    with pytest.raises(ValueError, match="language 'klingon'"):
        build_prompt(tok, ids, "Hi.", "ryan", "klingon")
    with pytest.raises(ValueError, match="language 'sichuan_dialect'"):  # dialects are not languages
        build_prompt(tok, ids, "Hi.", "ryan", "sichuan_dialect")
    with pytest.raises(ValueError, match="no named voices"):
        build_prompt(tok, _ids(tts_model_type="voice_design"), "Hi.", "ryan")
    with pytest.raises(ValueError, match="does not take instructions"):
        build_prompt(tok, _ids(tts_model_size="0b6"), "Hi.", "ryan", instruct="Loud.")


def test_tiny_registry_model_samples_and_decodes() -> None:
    """`qwen3-tts-tiny` (no checkpoint) builds from the registry and streams audio with default sampling."""
    from tests.engine_helpers import build_program
    from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig

    config = VoxConfig(model=ModelConfig(model="qwen3-tts-tiny", device="cpu"),
                       cache=CacheConfig(page_size=16, max_num_pages=64),
                       scheduler=SchedulerConfig(max_batch_size=4, max_prefill_tokens=256, detokenize_interval=3))
    program = build_program(config)
    meta = program.meta
    assert (meta.codes_per_step, meta.input_columns, meta.samples_per_frame) == (4, 5, 1920)
    assert meta.voices == ("vivian", "ryan", "eric") and "auto" in meta.languages
    fields = [{"text": "Hello there.", "max_tokens": 7, "ignore_eos": True},
              {"text": "Hello there.", "voice": "eric", "max_tokens": 7, "ignore_eos": True, "seed": 5}]
    reqs, _ = run_requests(program, config, fields, greedy=False)
    for req in reqs:
        assert req.num_generated == 7 and all(0 <= c < 2048 for c in req.codes)
        assert sum(len(c) for c in req.extra["chunks"]) == 7 * 1920 * 2
    assert reqs[0].tokens != reqs[1].tokens

"""CSM served through the real scheduler and the spec-driven worker, on the tiny checkpoint transformers wrote.

The reference for frames is part 1's eager loop (csm_helpers.EagerGenerator: our backbone and depth decoder,
shown identical to transformers' `generate` in test_csm_equivalence.py); for audio, transformers' own
`output_audio` (Mimi decoding of the frames up to the first all-zero one). Served audio arrives as int16 PCM
chunks: it must equal the reference's float audio, clamped and rounded, within AUDIO_LSB steps, whatever the
chunking. Every policy, asynchronous scheduling, a smaller first chunk and KV preemption change nothing.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from csm_helpers import (
    EagerGenerator,
    reference_model,
    reference_processor,
    reference_text,
    wav_bytes,
)
from orpheus_helpers import run_requests
from test_csm_equivalence import clip

from tests.engine_helpers import make_loop, prepare
from vox_serve.config import CacheConfig, ModelConfig, SchedulerConfig, VoxConfig
from vox_serve.models.csm.context import encode_context
from vox_serve.models.csm.loader import load_csm
from vox_serve.models.csm.program import DEFAULT_SAMPLING
from vox_serve.models.csm.prompt import build_prompt, parse_fields
from vox_serve.models.registry import FAMILIES, family_of
from vox_serve.rt.attention.kv_write import QKPrep
from vox_serve.rt.checkpoint import CheckpointError
from vox_serve.scheduler.base import Scheduler

AUDIO_LSB = 2  # int16 steps between served PCM and the reference's audio (float32 rounding at the boundary)
FRAMES = 8
FIELDS = [{"text": "Hello there.", "speaker": 0, "max_tokens": FRAMES},
          {"text": "Another, longer sentence for the batch.", "speaker": 1, "max_tokens": FRAMES - 2},
          {"text": "Short.", "speaker": 2, "max_tokens": FRAMES}]
STOP_FIELDS = [{"text": t, "speaker": s, "max_tokens": 24} for s, t in
               [(0, "Hello"), (1, "there friend"), (2, "friend what a"), (0, "it has been really short")]]
POLICIES = ("base", "online", "offline", "deadline")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_program(ckpt: Path, frames_per_chunk: int = 3, max_num_pages: int = 128, policy: str = "base",
                 first_chunk_frames: int | None = None, max_prefill_tokens: int = 256):
    program = load_csm(str(ckpt), "auto", torch.device("cpu"), torch.float32, seed=0, max_model_len=512)
    config = VoxConfig(model=ModelConfig(model=str(ckpt), device="cpu"),
                       cache=CacheConfig(page_size=16, max_num_pages=max_num_pages),
                       scheduler=SchedulerConfig(max_batch_size=4, max_prefill_tokens=max_prefill_tokens,
                                                 max_codec_batch=4, detokenize_interval=frames_per_chunk,
                                                 scheduler_type=policy, first_chunk_frames=first_chunk_frames))
    return prepare(program, config), config


def eager_frames(program, field_sets: list[dict], max_frames: int) -> list[list[list[int]]]:  # noqa: ANN001
    """Part 1's eager loop over the same modules (greedy), from the same prompts."""
    prompts = [build_prompt(program.tokenizer, program.ids, encode_context(program.m.codec_encoder,
                                                                           parse_fields(f, program.ids)))
               for f in field_sets]
    return EagerGenerator(program.m, max_len=512, max_rows=len(prompts)).generate(prompts, max_frames)


def pcm_of(req) -> np.ndarray:  # noqa: ANN001
    return np.frombuffer(b"".join(req.extra["chunks"]), dtype="<i2").astype(np.int32)


def as_pcm(audio: torch.Tensor) -> np.ndarray:
    return (audio.float().clamp(-1, 1) * 32767).round().to(torch.int32).numpy()


def assert_audio(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.size > 0
    assert np.abs(got - want).max() <= AUDIO_LSB
    assert (np.abs(want) < 32767).mean() > 0.05  # not only clipped samples: the values were compared


@pytest.fixture(scope="module")
def served(tiny_csm_dir: Path):  # noqa: ANN201
    """FIELDS (and a request with context turns) served with base scheduling; the eager frames of each."""
    program, config = make_program(tiny_csm_dir)
    codes = [[(7 * f + 31 * k) % 2048 for k in range(32)] for f in range(3)]
    context = [{"text": "First turn.", "speaker": 1, "audio": wav_bytes(clip(0.9, 1))},
               {"text": "No audio here.", "speaker": 0}, {"text": "Third turn.", "speaker": 1, "codes": codes}]
    fields = [*FIELDS, {"text": "And now me.", "speaker": 0, "context": context, "max_tokens": FRAMES}]
    reqs = run_requests(program, config, fields)
    want = [frames[: f["max_tokens"]] for f, frames in zip(fields, eager_frames(program, fields, FRAMES), strict=True)]
    return program, fields, reqs, want


def test_served_frames_equal_the_eager_loop(served) -> None:
    _, fields, reqs, want = served
    for f, req, frames in zip(fields, reqs, want, strict=True):
        assert req.finish_reason == "length" and req.num_generated == f["max_tokens"]
        assert req.tokens == frames and req.codes == sum(frames, [])
        assert len(req.prompt.ids[0]) == 33
    assert reqs[0].tokens != reqs[2].tokens  # speakers and texts steer the frames
    audio_rows = (reqs[3].prompt.ids[:, 32] == -1).sum()
    assert audio_rows == (12 + 1) + (3 + 1)  # the clip's ceil(0.9 s / 80 ms) frames, the codes, each + eos


def test_served_audio_equals_the_reference_output_audio(served, tiny_csm_dir: Path) -> None:
    """transformers decodes the generated frames with its MimiModel; the served chunks (3 frames each)
    carry the same audio. Random weights sample ids past Mimi's 2048 codes, which its embedding cannot take:
    they are clamped here as the codec stage clamps them."""
    program, _, reqs, want = served
    model = reference_model(tiny_csm_dir)
    assert any(c >= 2048 for frames in want for frame in frames for c in frame)  # the clamp is exercised
    for req, frames in zip(reqs, want, strict=True):
        with torch.no_grad():
            audio = model.codec_model.decode(torch.tensor(frames).clamp(max=2047).t()[None]).audio_values[0, 0]
        assert_audio(pcm_of(req), as_pcm(audio))
        assert [len(c) // 2 for c in req.extra["chunks"]][0] == 3 * 1920


@pytest.mark.parametrize("how", [*POLICIES, "async", "first-chunk", "one-chunk", "preemption"])
def test_every_policy_and_mode_serves_the_same_frames_and_audio(tiny_csm_dir: Path, served, how: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunked streaming equals one-shot decoding (`one-chunk`: the whole utterance in one chunk), a first chunk
    of 1 frame changes only the chunking, and a request preempted under KV pressure recomputes its KV from the
    history on the device and keeps its Mimi state."""
    _, fields, base_reqs, want = served
    options = {"first-chunk": {"first_chunk_frames": 1}, "one-chunk": {"frames_per_chunk": FRAMES},
               "preemption": {"max_num_pages": 6}}.get(how, {})  # 14 at the peak, 6 for one
    program, config = make_program(tiny_csm_dir, policy=how if how in POLICIES else "base", **options)
    preempted: list[str] = []
    original = Scheduler._preempt
    monkeypatch.setattr(Scheduler, "_preempt", lambda self, req: (preempted.append(req.req_id), original(self, req)))
    loop = make_loop(program, config, async_scheduling=how == "async")
    reqs = run_requests(program, config, fields, loop)
    assert bool(preempted) == (how == "preemption")
    for req, base, frames in zip(reqs, base_reqs, want, strict=True):
        assert req.tokens == frames
        assert np.abs(pcm_of(req) - pcm_of(base)).max() <= 1
    sizes = [len(c) // 2 // 1920 for c in reqs[0].extra["chunks"]]
    assert sizes == {"first-chunk": [1, 3, 3, 1], "one-chunk": [8]}.get(how, [3, 3, 2])


@pytest.mark.parametrize("case", ["last-code-kept", "all-zero"])
def test_the_stop_frame_is_kept_or_cut_as_the_reference_does(csm_stop_dirs, case: str) -> None:
    """The stop frame (codebooks 0..30 zero) ends the request: with a code in its last codebook it is audio
    (AUDIO_STOP), all zero it is not (STOP); the audio equals transformers' output_audio either way."""
    ckpt = csm_stop_dirs[case]
    program, config = make_program(ckpt)
    reqs = run_requests(program, config, STOP_FIELDS)
    model, processor = reference_model(ckpt), reference_processor()
    stopped = 0
    for f, req in zip(STOP_FIELDS, reqs, strict=True):
        inputs = processor(reference_text([(f["speaker"], f["text"], False)]))
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=24, do_sample=False, depth_decoder_do_sample=False,
                                 output_audio=True, return_dict_in_generate=True)
        frames = out.sequences[0].tolist()
        ends = frames[-1][:31] == [0] * 31
        stopped += ends
        kept = frames[:-1] if ends and case == "all-zero" else frames
        assert req.finish_reason == ("stop" if ends else "length")
        assert req.tokens == kept and req.num_generated == len(kept)
        if kept:
            assert_audio(pcm_of(req), as_pcm(out.audio[0]))
        else:
            assert pcm_of(req).size == 0
    assert 0 < stopped < len(STOP_FIELDS)


def test_ignore_eos_keeps_generating_through_stop_frames(csm_stop_dirs) -> None:
    program, config = make_program(csm_stop_dirs["all-zero"])
    [req] = run_requests(program, config, [{**STOP_FIELDS[0], "max_tokens": 12, "ignore_eos": True}])
    assert req.finish_reason == "length" and req.num_generated == 12
    assert any(frame == [0] * 32 for frame in req.tokens)  # all-zero frames are audio then
    assert pcm_of(req).size == 12 * 1920


def test_sampling_draws_per_codebook_and_ignores_the_batch(tiny_csm_dir: Path) -> None:
    """Sampled frames depend on the request's seed only (not on which requests share its batch); each
    codebook draws its own numbers; other seeds give other frames."""
    program, config = make_program(tiny_csm_dir)
    fields = {"text": "Hello there.", "max_tokens": 6, "seed": 11}
    alone = run_requests(program, config, [fields], greedy=False)[0].tokens
    batched = run_requests(program, config, [FIELDS[1], fields, {**fields, "seed": 12}], greedy=False)
    assert batched[1].tokens == alone
    assert batched[2].tokens != alone
    assert len({c for frame in alone for c in frame}) > 20  # not one draw repeated across codebooks


def test_depth_decoder_parameters_reach_the_stage(tiny_csm_dir: Path) -> None:
    """depth_decoder_temperature 0 with a sampled backbone: codebooks 1..31 are the depth decoder's greedy
    choices after each sampled codebook 0."""
    program, config = make_program(tiny_csm_dir)
    fields = {"text": "Hello there.", "max_tokens": 5, "seed": 3, "depth_decoder_temperature": 0.0}
    [req] = run_requests(program, config, [fields], greedy=False)
    sampled = run_requests(program, config, [{**fields, "depth_decoder_temperature": 0.9}], greedy=False)[0]
    assert req.tokens[0][0] == sampled.tokens[0][0]  # the first codebook 0 is drawn alike (the rest follow the frames)
    assert req.tokens != sampled.tokens
    m = program.m
    m.depth.allocate(1)
    greedy = lambda logits, k: logits.argmax(-1)  # noqa: E731
    with torch.no_grad():
        for index, frame in enumerate(req.tokens):
            hidden = _backbone_hidden(program, req, index)
            rest = m.depth.sample_frame(hidden, torch.tensor([frame[0]]), m.backbone.codebook_embedding, greedy)
            assert rest[0].tolist() == frame


def test_a_huge_depth_top_k_keeps_every_id_as_zero_does(tiny_csm_dir: Path) -> None:
    """depth_decoder_top_k is a 64-bit integer field; past the vocabulary it is no limit (the slot field holds
    it as float32, where 2**63 - 1 would not survive)."""
    program, config = make_program(tiny_csm_dir)
    fields = {"text": "Hello there.", "max_tokens": 4, "seed": 5}
    off, huge = (run_requests(program, config, [{**fields, "depth_decoder_top_k": k}], greedy=False)[0].tokens
                 for k in (0, 2**63 - 1))
    assert off == huge
    slot_field = program.preprocess({**fields, "depth_decoder_top_k": 2**63 - 1}).conditioning["depth_sampling"]
    assert np.allclose(slot_field, [0.9, 2051, 1.0])  # temperature, top_k (bounded by the vocabulary), top_p
    assert run_requests(program, config, [{**fields, "depth_decoder_top_k": 1}], greedy=False)[0].tokens != off


def _causal(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prep: QKPrep) -> torch.Tensor:
    """Whole-sequence causal attention, q [T, Hq, D], k/v [T, Hkv, D]."""
    q, k = prep.apply(q, k)
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                           is_causal=True, enable_gqa=True)
    return out.transpose(0, 1)


def _backbone_hidden(program, req, index: int) -> torch.Tensor:  # noqa: ANN001
    """The backbone's last hidden state [1, hidden] before frame `index` of `req`, recomputed over the whole
    sequence (no paged KV)."""
    rows = req.prompt.ids.tolist() + [frame + [-1] for frame in req.tokens[:index]]
    return program.m.backbone(torch.tensor(rows), torch.arange(len(rows)), _causal)[-1:]


def test_generation_config_sets_the_defaults(tiny_csm_dir: Path, tmp_path: Path) -> None:
    """The reference's defaults, overridden by the keys a checkpoint's generation_config.json has."""
    program, _ = make_program(tiny_csm_dir)
    assert {k: program.meta.default_sampling[k] for k in DEFAULT_SAMPLING} == DEFAULT_SAMPLING
    assert DEFAULT_SAMPLING["temperature"] == DEFAULT_SAMPLING["depth_decoder_temperature"] == 0.9
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_csm_dir, ckpt)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    gen.update(max_new_tokens=300, top_k=20, depth_decoder_temperature=0.7, depth_decoder_do_sample=False)
    (ckpt / "generation_config.json").write_text(json.dumps(gen))
    program = load_csm(str(ckpt), "auto", torch.device("cpu"), torch.float32, seed=0, max_model_len=512)
    d = program.meta.default_sampling
    assert (d["max_tokens"], d["top_k"], d["temperature"], d["depth_decoder_temperature"]) == (300, 20, 0.9, 0.0)
    assert dataclasses.asdict(program.meta.stop_rule)["keeps_frame"]


def test_names_and_checkpoint_dirs_resolve_to_csm(tiny_csm_dir: Path) -> None:
    """`csm`, `csm-tiny`, the Hugging Face id and a directory whose config.json says `model_type: csm`."""
    for name in ("csm", "csm-tiny", "sesame/csm-1b", str(tiny_csm_dir)):
        assert family_of(name) is FAMILIES["csm"]
    with pytest.raises(CheckpointError, match="codec-path"):
        load_csm(str(tiny_csm_dir), "auto", torch.device("cpu"), torch.float32, seed=0, max_model_len=64,
                 codec_path="/somewhere")

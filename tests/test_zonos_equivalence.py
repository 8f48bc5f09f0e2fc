"""Zonos LM, prefix conditioner and generation against the upstream Zonos source (fixtures).

tests/fixtures/zonos/ holds a tiny random checkpoint in the published layout and what the upstream
`Zonos.generate` produced from it (see its README). Tolerances: float32 throughout; logits differ from
the reference only in summation order (observed < 4e-6 at |logits| ~ 10).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from zonos_helpers import FIXTURES, generate, needs_espeak, scenario_sampling

from vox_serve.models.zonos import phonemes
from vox_serve.models.zonos.conditioning import condition_inputs, num_prefix_rows
from vox_serve.models.zonos.config import ZONOS_TRANSFORMER_CONFIG, ZonosConfig
from vox_serve.models.zonos.loader import load_zonos_lm
from vox_serve.rt.checkpoint import CheckpointError

LOGITS_ATOL = 2e-5
COND_ATOL = 1e-5  # float32 projection + LayerNorm, summation order across CPUs' kernels (observed 7e-7)
SCENARIOS = json.loads((FIXTURES / "scenarios.json").read_text())
GENERATION = ("greedy", "topk1_prefix", "greedy_short", "max_tokens")


@pytest.fixture(scope="module")
def lm():
    return load_zonos_lm(FIXTURES / "checkpoint", torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def expected() -> dict[str, torch.Tensor]:
    return load_file(FIXTURES / "expected_generation.safetensors")


@pytest.mark.parametrize("name", GENERATION)
def test_generation_matches_reference(lm, expected, name: str) -> None:
    """Codes, every delayed column (delay pattern, stop diagonal, the last-8-steps quirk) and the first
    steps' guided logits equal upstream's; the conditioning comes from the fixture here."""
    spec = SCENARIOS[name]
    params, window = scenario_sampling(spec)
    out = generate(lm, expected[f"{name}.conditioning"], max_new_tokens=spec["generate"]["max_new_tokens"],
                   cfg_scale=spec["generate"]["cfg_scale"], params=params,
                   prefix_codes=expected.get(f"{name}.prefix_codes"), repetition_window=window)
    assert torch.equal(out.delayed, expected[f"{name}.delayed_codes"])
    assert torch.equal(out.codes, expected[f"{name}.codes"])
    if f"{name}.logits" in expected:
        for got, want in zip(out.logits, expected[f"{name}.logits"], strict=False):
            finite = torch.isfinite(want)
            assert torch.equal(finite, torch.isfinite(got[0]))
            assert (got[0][finite] - want[finite]).abs().max() < LOGITS_ATOL


def test_scenarios_cover_the_stop_rules(expected) -> None:
    """The fixtures exercise EOS (diagonal) and running out of frames (shifted last columns)."""
    greedy = expected["greedy.delayed_codes"][0]
    eos_col = int((greedy[0] == 1024).nonzero()[0])
    assert [int(greedy[k, eos_col + k]) for k in range(9)] == [1024] * 9
    assert expected["greedy.codes"].shape[2] == eos_col - 1 < SCENARIOS["greedy"]["generate"]["max_new_tokens"]
    assert expected["max_tokens.codes"].shape[2] == SCENARIOS["max_tokens"]["generate"]["max_new_tokens"]


@pytest.mark.parametrize("name", GENERATION)
def test_prefix_conditioning_matches_reference(lm, expected, name: str) -> None:
    """Phonemes through espeak-ng, speaker / emotion / fmax / pitch / rate / language rows, unconditional
    vectors for missing inputs, projection and LayerNorm: upstream's prepare_conditioning up to float32
    summation order (bit-identical on the CPU that made the fixture)."""
    needs_espeak()
    cond = dict(SCENARIOS[name]["cond"])
    text, language = cond.pop("text"), cond.pop("language")
    if cond.get("speaker") == "fixture speaker":
        cond["speaker"] = expected[f"{name}.speaker"][0].tolist()
    unconditional = frozenset(SCENARIOS[name]["extra"].get("unconditional_keys", ()))
    ids = phonemes.phoneme_ids(phonemes.phonemize(text, language))
    inputs = condition_inputs(lm.cfg, ids, phonemes.language_id(language), values=cond, unconditional=unconditional)
    with torch.no_grad():
        got = lm.prefix_conditioner.guidance_pair(inputs)
    want = expected[f"{name}.conditioning"]
    assert got.shape == want.shape and got.shape[1] == num_prefix_rows(lm.cfg, inputs)
    assert (got - want).abs().max() <= COND_ATOL


def test_phonemes_match_reference() -> None:
    """Number spelling (years, ordinals, currency, decimals, thousands) and espeak-ng phonemes for several
    languages; the symbol table and language list equal upstream's."""
    needs_espeak()
    fx = json.loads((FIXTURES / "expected_phonemes.json").read_text(encoding="utf-8"))
    assert list(phonemes.SYMBOLS) == fx["symbols"] and list(phonemes.LANGUAGES) == fx["languages"]
    for case in fx["cases"]:
        got = phonemes.phonemize(case["text"], case["language"])
        assert got == case["phonemes"], case["text"]
        assert phonemes.phoneme_ids(got) == case["ids"]


def test_number_spelling_rules() -> None:
    spell = phonemes.spell_out_numbers
    assert spell("1999") == "nineteen ninety-nine"
    assert spell("2000 2007 1900") == "two thousand two thousand seven nineteen hundred"
    assert spell("$1.01") == "one dollar, one cent"
    assert spell("£1,000") == "one thousand pounds"
    assert spell("3.5") == "three point five"
    assert spell("21st") == "twenty-first"


def test_languages_are_checked() -> None:
    with pytest.raises(ValueError, match="not one of"):
        phonemes.check_language("xx")
    with pytest.raises(ValueError, match="sudachipy"):
        phonemes.check_language("ja")
    assert phonemes.language_id("EN-US") == phonemes.LANGUAGES.index("en-us")


def test_condition_inputs_errors(lm) -> None:
    with pytest.raises(ValueError, match="emotion"):
        condition_inputs(lm.cfg, [2, 3], 0, values={"emotion": [0.0] * 8})
    inputs = condition_inputs(lm.cfg, [2, 3], 0, values={"speaker": [0.0] * 5})
    with pytest.raises(ValueError, match="speaker.*128"):
        lm.prefix_conditioner(inputs)
    with pytest.raises(ValueError, match="language_id"):
        lm.prefix_conditioner(condition_inputs(lm.cfg, [2, 3], 500))


def test_loading_is_strict(tmp_path, lm) -> None:
    """Extra, missing and mis-shaped keys fail with their names (upstream's from_local fails on extra keys)."""
    sd = load_file(FIXTURES / "checkpoint" / "model.safetensors")
    (tmp_path / "config.json").write_text((FIXTURES / "checkpoint" / "config.json").read_text())
    cases = {"unexpected": {**sd, "extra.weight": torch.zeros(1)},
             "missing": {k: v for k, v in sd.items() if k != "heads.3.weight"},
             "wrong shapes": {**sd, "heads.3.weight": torch.zeros(1026, lm.cfg.d_model)}}
    for what, tensors in cases.items():
        save_file(tensors, str(tmp_path / "model.safetensors"))
        with pytest.raises(CheckpointError, match=what):
            load_zonos_lm(tmp_path, torch.device("cpu"), torch.float32)


def test_config_checks() -> None:
    cfg = ZonosConfig.from_dict(ZONOS_TRANSFORMER_CONFIG)
    assert (cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (2048, 26, 16, 4, 128)
    assert cfg.logits_width == 1026
    hybrid = json.loads(json.dumps(ZONOS_TRANSFORMER_CONFIG))
    hybrid["backbone"]["ssm_cfg"] = {"layer": "Mamba2"}
    with pytest.raises(CheckpointError, match="hybrid"):
        ZonosConfig.from_dict(hybrid)
    partial = json.loads(json.dumps(ZONOS_TRANSFORMER_CONFIG))
    partial["backbone"]["attn_cfg"]["rotary_emb_dim"] = 64
    with pytest.raises(CheckpointError, match="rotary_emb_dim"):
        ZonosConfig.from_dict(partial)


def test_dummy_weights_have_real_shapes() -> None:
    small = json.loads(json.dumps(ZONOS_TRANSFORMER_CONFIG))
    small["backbone"].update(d_model=64, n_layer=1, attn_mlp_d_intermediate=32)
    small["backbone"]["attn_cfg"]["rotary_emb_dim"] = 4
    lm = load_zonos_lm(None, torch.device("cpu"), torch.float32, config=small, seed=3)
    fourier = lm.prefix_conditioner.conditioners[2].weight
    assert fourier.shape == (32, 8) and fourier.std() > 0.5

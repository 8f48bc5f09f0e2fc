"""Our Qwen3-TTS-Tokenizer-12Hz decoder vs the reference (PyPI qwen-tts), streaming through slots, loader.

The reference runs in its own venv (.venv-qwen, transformers 4.57.3): one subprocess per session runs
tests/qwen_ref/codec_ref.py, which writes tiny checkpoints with the reference's `save_pretrained` and the
reference's audio for fixed codes. Shrunk there: widths and depth (and, in "window6", the attention window);
kept: 16 groups x 2048 codes and the 1920-sample frame.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vox_serve.codecs.qwen3.decoder import Qwen3CodecConfig, Qwen3CodecDecoder, Qwen3CodecSlots

REPO = Path(__file__).resolve().parents[1]
REF_PYTHON = REPO / ".venv-qwen" / "bin" / "python"
REF_SCRIPT = REPO / "tests" / "qwen_ref" / "codec_ref.py"
REF_RTOL = 1e-5  # relative L2 error vs the reference, float32 (observed 1.1e-6 .. 1.7e-6)
REF_ATOL = 2e-5  # max abs error vs the reference, float32, audio std 0.25 (observed < 5e-6)
STREAM_ATOL = 2e-5  # streaming vs one-shot, float32: only summation order differs (observed < 4e-6)
CONFIGS = ("window6", "window72")
TINY = Qwen3CodecConfig(codebook_dim=16, latent_dim=24, hidden_size=32, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, intermediate_size=48, num_hidden_layers=2,
                        sliding_window=6, decoder_dim=32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="session")
def qwen_ref(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """{config name: {"path", "frames", ...}}: checkpoints + reference audio written by the reference."""
    if not REF_PYTHON.exists():
        reason = f"{REF_PYTHON} missing: run scripts/setup_qwen_reference.sh"
        if os.environ.get("VOX_REQUIRE_QWEN_REF") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("qwen3-codec-ref")
    proc = subprocess.run([str(REF_PYTHON), str(REF_SCRIPT), str(out)], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode:
        pytest.fail(f"{REF_SCRIPT.name} failed:\n{proc.stderr[-4000:]}")
    return json.loads((out / "manifest.json").read_text())


def reference_audio(ckpt: str) -> tuple[torch.Tensor, torch.Tensor]:
    ref = load_file(os.path.join(ckpt, "reference_audio.safetensors"))
    return ref["codes"], ref["audio"]


def errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    assert got.shape == want.shape and got.dtype == torch.float32
    return (got - want).abs().max().item(), ((got - want).norm() / want.norm()).item()


def write_checkpoint(src: str, dst: Path, sd: dict[str, torch.Tensor], config: dict | None = None) -> str:
    """A copy of the checkpoint folder ``src`` with other weights (and optionally another config)."""
    dst.mkdir(parents=True)
    cfg = config if config is not None else json.loads(Path(src, "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(cfg))
    shutil.copy(Path(src, "preprocessor_config.json"), dst)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(dst / "model.safetensors"))
    return str(dst)


def stream(pool: Qwen3CodecSlots, codes: torch.Tensor, slots: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    assert sum(chunks) == codes.shape[1]
    out, start = [], 0
    for n in chunks:
        out.append(pool.decode_chunk(codes[:, start:start + n], slots))
        start += n
    return torch.cat(out, dim=-1)


def split(frames: int, first: int, size: int) -> list[int]:
    """``first`` frames, then chunks of ``size``, then the remainder."""
    rest = frames - first
    return [first] + [size] * (rest // size) + ([rest % size] if rest % size else [])


# ---- equivalence with the reference ---------------------------------------------------------------------

@pytest.mark.parametrize("name", CONFIGS)
def test_one_shot_matches_reference(qwen_ref, name: str) -> None:
    ckpt = qwen_ref[name]["path"]
    dec = Qwen3CodecDecoder.from_dir(ckpt)
    codes, want = reference_audio(ckpt)
    assert codes.shape == (2, qwen_ref[name]["frames"], 16)
    assert want.std() > 0.1 and (want.abs() >= 1).float().mean() < 1e-3  # non-trivial, not clamped
    got = dec.decode(codes)
    err, rel = errors(got, want)
    print(f"{name}: max abs {err:.2e} rel {rel:.2e}")
    assert err < REF_ATOL and rel < REF_RTOL
    assert dec.config.samples_per_frame == 1920 and dec.config.sample_rate == 24000
    assert errors(dec.decode(codes, max_chunk_frames=7), got)[0] < STREAM_ATOL  # internal chunking is exact


def test_streaming_matches_reference(qwen_ref) -> None:
    ckpt = qwen_ref["window72"]["path"]
    dec = Qwen3CodecDecoder.from_dir(ckpt)
    codes, want = reference_audio(ckpt)
    got = stream(Qwen3CodecSlots(dec, num_slots=3), codes, torch.tensor([2, 0]), split(codes.shape[1], 3, 10))
    err, rel = errors(got, want)
    assert err < REF_ATOL and rel < REF_RTOL, (err, rel)


def test_long_decode_is_the_unchunked_forward(qwen_ref) -> None:
    """Past 300 frames the reference's public decode restarts every 300 frames with 25 frames of left
    context; ours stays the exact causal decode, i.e. the reference decoder's single forward pass."""
    dec = Qwen3CodecDecoder.from_dir(qwen_ref["window72"]["path"])
    ref = load_file(os.path.join(qwen_ref["window72"]["path"], "reference_audio.safetensors"))
    got = dec.decode(ref["long_codes"])  # 330 frames: internally 300 + 30
    err, rel = errors(got, ref["long_audio_forward"])
    assert err < REF_ATOL and rel < REF_RTOL, (err, rel)
    head = 300 * 1920
    assert errors(got[:, :head], ref["long_audio_decode"][:, :head])[0] < REF_ATOL
    assert (got[:, head:] - ref["long_audio_decode"][:, head:]).abs().max() > 1e-2


def test_loads_checkpoint_folder_with_speech_tokenizer_inside(qwen_ref, tmp_path) -> None:
    ckpt = qwen_ref["window6"]["path"]
    os.symlink(ckpt, tmp_path / "speech_tokenizer")
    dec = Qwen3CodecDecoder.from_dir(str(tmp_path))
    codes, want = reference_audio(ckpt)
    assert errors(dec.decode(codes), want)[1] < REF_RTOL


def test_bfloat16_load(qwen_ref) -> None:
    ckpt = qwen_ref["window6"]["path"]
    dec = Qwen3CodecDecoder.from_dir(ckpt, dtype=torch.bfloat16)
    assert dec.dtype == torch.bfloat16
    codes, want = reference_audio(ckpt)
    got = dec.decode(codes[:, :16]).float()
    assert ((got - want[:, :got.shape[1]]).norm() / want[:, :got.shape[1]].norm()).item() < 0.1


# ---- weight norm dialects and loader errors --------------------------------------------------------------

def weight_norm_layout(sd: dict[str, torch.Tensor], dialect: str) -> dict[str, torch.Tensor]:
    """Every conv weight as a weight-norm pair: v = w * (random positive per-g factor), g = ||w||.

    "weight_g": weight_g/weight_v over dim 0; "parametrizations": original0/original1, over dim 1 for the
    transposed convs ([in, out, k]) and dim 0 for the others.
    """
    g_sfx, v_sfx = {"weight_g": (".weight_g", ".weight_v"),
                    "parametrizations": (".parametrizations.weight.original0",
                                         ".parametrizations.weight.original1")}[dialect]
    gen = torch.Generator().manual_seed(3)
    out = {}
    for k, w in sd.items():
        if not (k.endswith(".conv.weight") and k.startswith("decoder.")):
            out[k] = w
            continue
        transposed = ".block.1.conv" in k or k.startswith("decoder.upsample.")
        dim = 1 if dialect == "parametrizations" and transposed else 0
        dims = [i for i in range(w.dim()) if i != dim]
        g = torch.linalg.vector_norm(w, dim=dims, keepdim=True)
        factor = 0.5 + torch.rand(g.shape, generator=gen)
        base = k[: -len(".weight")]
        out[base + g_sfx], out[base + v_sfx] = g, w * factor
    return out


@pytest.mark.parametrize("dialect", ["weight_g", "parametrizations"])
def test_weight_norm_dialects(qwen_ref, tmp_path, dialect: str) -> None:
    ckpt = qwen_ref["window6"]["path"]
    sd = weight_norm_layout(load_file(os.path.join(ckpt, "model.safetensors")), dialect)
    assert not any(k.startswith("decoder.") and k.endswith(".conv.weight") for k in sd)
    dec = Qwen3CodecDecoder.from_dir(write_checkpoint(ckpt, tmp_path / "c", sd))
    codes, want = reference_audio(ckpt)
    err, rel = errors(dec.decode(codes), want)
    assert err < REF_ATOL and rel < REF_RTOL, (err, rel)


def test_loader_errors(qwen_ref, tmp_path) -> None:
    ckpt = qwen_ref["window6"]["path"]
    full = load_file(os.path.join(ckpt, "model.safetensors"))

    def load(name: str, sd: dict, config: dict | None = None) -> Qwen3CodecDecoder:
        return Qwen3CodecDecoder.from_dir(write_checkpoint(ckpt, tmp_path / name, sd, config))

    codebook = "decoder.quantizer.rvq_rest.vq.layers.3._codebook.cluster_usage"
    sd = {k: v for k, v in full.items() if k not in ("decoder.decoder.6.conv.bias", codebook)}
    with pytest.raises(ValueError, match=r"missing decoder weights \['decoder\.quantizer\.rvq_rest\.vq\.layers\.3"
                                         r"\._codebook\.cluster_usage', 'decoder\.decoder\.6\.conv\.bias'\]"):
        load("missing", sd)
    with pytest.raises(ValueError, match=r"unexpected keys \['decoder\.extra\.weight'\]"):
        load("unexpected", {**full, "decoder.extra.weight": torch.zeros(2)})
    bad = dict(full, **{"decoder.pre_conv.conv.weight": torch.zeros(3, 3, 3)})
    with pytest.raises(ValueError, match=r"shape mismatches \['decoder\.pre_conv\.conv\.weight: \(3, 3, 3\)"):
        load("shape", bad)
    sd = weight_norm_layout(full, "weight_g")
    del sd["decoder.decoder.6.conv.weight_v"]  # unpaired g: the fused weight is missing, the g unexpected
    with pytest.raises(ValueError, match=r"decoder\.decoder\.6\.conv\.weight'.*unexpected keys "
                                         r"\['decoder\.decoder\.6\.conv\.weight_g'\]"):
        load("unpaired", sd)
    config = json.loads(Path(ckpt, "config.json").read_text())
    config["decoder_config"]["num_quantizers"] = 15  # the file has one group more than the config
    with pytest.raises(ValueError, match=r"unexpected keys \['decoder\.quantizer\.rvq_rest\.vq\.layers\.14\."):
        load("groups", full, config)
    load("nofile", full)
    os.remove(tmp_path / "nofile" / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        Qwen3CodecDecoder.from_dir(str(tmp_path / "nofile"))
    decoder_only = {k: v for k, v in full.items() if k.startswith("decoder.")}  # the encoder is never needed
    load("decoder_only", decoder_only)


def test_config_dialects() -> None:
    base = {"decoder_config": {"codebook_dim": 512, "hidden_size": 512, "num_attention_heads": 16,
                               "rope_theta": 5000.0},
            "output_sample_rate": 24000, "decode_upsample_rate": 1920}
    cfg = Qwen3CodecConfig.from_dict(base)
    assert cfg.head_dim == 32 and cfg.rope_theta == 5000.0  # no head_dim: hidden / heads, as the reference
    assert cfg.samples_per_frame == 1920 and cfg.upsample_rates == (8, 5, 4, 3)
    tf5 = {"decoder_config": {"codebook_dim": 512, "head_dim": 64,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 123.0}}}
    assert Qwen3CodecConfig.from_dict(tf5).rope_theta == 123.0 and Qwen3CodecConfig.from_dict(tf5).head_dim == 64
    for bad, msg in [({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope type 'dynamic'"),
                     ({"hidden_act": "gelu"}, "hidden_act"), ({"upsample_rates": [8, 5, 4]}, "decode_upsample_rate")]:
        with pytest.raises(ValueError, match=msg):
            Qwen3CodecConfig.from_dict(dict(base, decoder_config={**base["decoder_config"], **bad}))
    with pytest.raises(ValueError, match="no codebook_dim"):
        Qwen3CodecConfig.from_dict({"decoder_config": {}})


# ---- streaming through slots (our decoder, random weights: no reference needed) --------------------------

@pytest.fixture(scope="module")
def tiny() -> Qwen3CodecDecoder:
    return Qwen3CodecDecoder.random(TINY, seed=0)


def random_codes(batch: int, frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (batch, frames, 16), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("chunks", [[1] * 24, split(24, 1, 4), split(24, 2, 10), split(24, 3, 7), [24],
                                    [5, 1, 9, 2, 7]], ids=lambda c: "-".join(map(str, c[:4])))
def test_streaming_equals_one_shot(tiny, chunks: list[int]) -> None:
    codes = random_codes(2, 24, seed=1)
    want = tiny.decode(codes)
    got = stream(Qwen3CodecSlots(tiny, num_slots=4), codes, torch.tensor([3, 1]), chunks)
    assert errors(got, want)[0] < STREAM_ATOL


def test_interleaved_requests_equal_each_alone(tiny) -> None:
    a, b = random_codes(1, 20, seed=2), random_codes(1, 14, seed=3)
    pool = Qwen3CodecSlots(tiny, num_slots=5)
    sa, sb = torch.tensor([4]), torch.tensor([1])
    out_a, out_b = [pool.decode_chunk(a[:, :6], sa)], []  # a starts alone, b joins 6 frames later
    for i in range(3):  # batches of both, a at frames 6 + 4i.., b at 4i..; rows swapped in the middle one
        fa, fb = a[:, 6 + 4 * i:10 + 4 * i], b[:, 4 * i:4 + 4 * i]
        if i == 1:
            pcm_b, pcm_a = pool.decode_chunk(torch.cat([fb, fa]), torch.tensor([1, 4]))
        else:
            pcm_a, pcm_b = pool.decode_chunk(torch.cat([fa, fb]), torch.tensor([4, 1]))
        out_a.append(pcm_a[None])
        out_b.append(pcm_b[None])
    out_a.append(pool.decode_chunk(a[:, 18:], sa))
    out_b.append(pool.decode_chunk(b[:, 12:], sb))
    assert errors(torch.cat(out_a, -1), tiny.decode(a))[0] < STREAM_ATOL
    assert errors(torch.cat(out_b, -1), tiny.decode(b))[0] < STREAM_ATOL


def test_reset_slot_makes_a_slot_fresh(tiny) -> None:
    a, b, c = random_codes(1, 9, seed=4), random_codes(1, 9, seed=5), random_codes(1, 12, seed=6)
    pool = Qwen3CodecSlots(tiny, num_slots=2)
    s0, s1 = torch.tensor([0]), torch.tensor([1])
    pool.decode_chunk(a, s0)
    first_c = pool.decode_chunk(c[:, :6], s1)  # slot 1 mid-stream while slot 0 is recycled
    pool.reset_slot(0)
    got_b = stream(pool, b, s0, [4, 5])
    pool.decode_chunk(a[:, :3], s0)
    pool.reset_slots(torch.tensor([0]))
    again_b = stream(pool, b, s0, [9])
    rest_c = pool.decode_chunk(c[:, 6:], s1)
    want_b = tiny.decode(b)
    assert errors(got_b, want_b)[0] < STREAM_ATOL and errors(again_b, want_b)[0] < STREAM_ATOL
    assert errors(torch.cat([first_c, rest_c], -1), tiny.decode(c))[0] < STREAM_ATOL  # neighbour untouched
    assert pool.pos.tolist() == [9, 12]


def test_output_is_causal(tiny) -> None:
    codes = random_codes(1, 16, seed=7)
    full = tiny.decode(codes)
    for k in (1, 7, 15):
        assert errors(tiny.decode(codes[:, :k]), full[:, :k * 1920])[0] < STREAM_ATOL
    changed = codes.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 2048
    out = tiny.decode(changed)
    assert torch.equal(out[:, :8 * 1920], full[:, :8 * 1920]) and (out - full).abs().max() > 1e-3


def test_slot_pool_layout(tiny) -> None:
    pool = Qwen3CodecSlots(tiny, num_slots=3)
    layout = dict(pool.layout())
    assert layout["pre_transformer"] == (2, 2, 2, 5, 8)  # layers, k/v, kv heads, window - 1, head dim
    assert layout["pre_conv"] == (16, 2) and layout["decoder.1.block.4.conv1"] == (16, 54)
    assert layout["decoder.1.block.1"] == (32, 1)  # transposed conv: one input frame
    assert pool.state.shape == (3, sum(torch.Size(s).numel() for s in layout.values()))
    assert pool.pos.dtype == torch.int64


def test_random_is_deterministic() -> None:
    a, b, c = (Qwen3CodecDecoder.random(TINY, seed=s) for s in (3, 3, 4))
    codes = random_codes(1, 6, seed=8)
    ya, yb, yc = a.decode(codes), b.decode(codes), c.decode(codes)
    assert torch.equal(ya, yb) and not torch.allclose(ya, yc)
    assert ya.shape == (1, 6 * 1920) and torch.isfinite(ya).all()
    assert 0.01 < ya.std() < 0.5 and (ya.abs() >= 1).float().mean() < 0.01
    assert a.decode(codes[:, :0]).shape == (1, 0)
    with pytest.raises(ValueError, match="expected 16 code groups per frame, got 8"):
        a.decode(codes[..., :8])


@pytest.mark.parametrize("window", [6, 72])
def test_priming_equals_decoding_the_prefix_first(window: int) -> None:
    """A slot primed with a prefix (right-aligned in the window, any length, 0 included) then streamed decodes the
    rest as one decode of prefix + rest does, past the prefix's audio; the neighbours' slots stay untouched."""
    import dataclasses

    dec = Qwen3CodecDecoder.random(dataclasses.replace(TINY, sliding_window=window), seed=0)
    prefix, rest = random_codes(4, 30, seed=8), random_codes(4, 9, seed=9)
    lengths = torch.tensor([0, 3, 17, 30])
    pool = Qwen3CodecSlots(dec, num_slots=6)
    other = random_codes(1, 5, seed=10)
    pool.decode_chunk(other, torch.tensor([5]))
    slots = torch.tensor([4, 1, 2, 0])
    pool.reset_slots(slots)
    pool.prime_slots(slots, prefix, lengths)
    assert pool.pos[slots].tolist() == lengths.tolist()
    got = stream(pool, rest, slots, [2, 7])
    for b, n in enumerate(lengths.tolist()):
        want = dec.decode(torch.cat([prefix[b:b + 1, :n], rest[b:b + 1]], 1))[:, n * 1920:]
        assert errors(got[b:b + 1], want)[0] < STREAM_ATOL, n
    assert errors(pool.decode_chunk(rest[:1, :3], torch.tensor([5])), dec.decode(torch.cat([other, rest[:1, :3]], 1))
                  [:, 5 * 1920:])[0] < STREAM_ATOL

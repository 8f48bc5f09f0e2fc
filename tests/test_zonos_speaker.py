"""The Zonos speaker model against the upstream source run on a tiny network (fixture): log-mel front
end, ResNet-SimAM, attentive pooling, LDA and the bf16 rounding; at 16 kHz and through resampling.

Tiny: width 2, blocks [2, 2, 3, 2], embedding 32 (the release: width 64, [10, 20, 64, 3], 256); kept: the
80-bin front end, the 128-channel attention and the 128-d LDA output.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from zonos_helpers import FIXTURES

from vox_serve.models.zonos.speaker import LDA_FILE, NETWORK_FILE, load_speaker_model, log_mel
from vox_serve.rt.checkpoint import CheckpointError

SPEAKER = FIXTURES / "speaker"
# The fixture was made on one CPU; another's kernels (AVX2 vs AVX-512, thread count) sum in another order.
EMBED_ATOL = 1e-5  # float32 network, summation order only (observed 1.8e-6, |lda| ~ 0.5)
RESAMPLED_ATOL = 1e-5  # our float64 resampling kernel vs torchaudio's float32 one (observed 2.2e-6)
# log(mel + 1e-6) of a 16 kHz tone: bands near the floor turn the FFT's ~1e-7 rounding into ~1e-3 of log
# (observed 8e-4 with AVX2 kernels, 0 with the fixture's own).
LOG_MEL_ATOL = 5e-3


@pytest.fixture(scope="module")
def model():
    return load_speaker_model(SPEAKER, torch.device("cpu"))


@pytest.fixture(scope="module")
def expected() -> dict[str, torch.Tensor]:
    return load_file(SPEAKER / "expected_speaker.safetensors")


@pytest.mark.parametrize("rate", [16000, 24000])
def test_embedding_matches_reference(model, expected, rate: int) -> None:
    emb, lda = model.embed(expected[f"wav_{rate}"], rate)
    tol = EMBED_ATOL if rate == 16000 else RESAMPLED_ATOL
    assert (emb - expected[f"embedding_{rate}"][0]).abs().max() <= tol
    assert (lda - expected[f"lda_{rate}"][0]).abs().max() <= tol
    got = model.speaker_vector(expected[f"wav_{rate}"], rate)
    want = expected[f"speaker_bf16_{rate}"][0, 0]
    assert torch.equal(got, got.bfloat16().float())  # rounded to bfloat16 as upstream does
    assert ((got - want.float()).abs() <= bf16_ulp(want)).all()  # a value near a rounding tie may go either way


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bfloat16 values at each element of x (8 significand bits)."""
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), torch.frexp(x.float()).exponent - 8)


def test_log_mel_matches_reference(model, expected) -> None:
    got = log_mel(expected["wav_16000"][None], model.filterbank)
    assert got.shape == expected["logmel_16000"].shape
    assert (got - expected["logmel_16000"]).abs().max() <= LOG_MEL_ATOL


def test_channels_are_averaged(model, expected) -> None:
    wav = expected["wav_16000"]
    stereo = torch.stack([wav * 0.5, wav * 1.5])
    assert torch.allclose(model.embed(stereo, 16000)[1], model.embed(wav, 16000)[1], atol=1e-6)


def test_block_counts_come_from_the_keys(model) -> None:
    assert [len(getattr(model.network.front, f"layer{i}")) for i in range(1, 5)] == [2, 2, 3, 2]


def test_loading_is_strict(tmp_path) -> None:
    sd = torch.load(SPEAKER / NETWORK_FILE, weights_only=True)
    torch.save({**sd, "extra.weight": torch.zeros(1)}, tmp_path / NETWORK_FILE)
    torch.save(torch.load(SPEAKER / LDA_FILE, weights_only=True), tmp_path / LDA_FILE)
    with pytest.raises(CheckpointError, match="extra.weight"):
        load_speaker_model(tmp_path, torch.device("cpu"))
    (tmp_path / LDA_FILE).unlink()
    with pytest.raises(CheckpointError, match="missing"):
        load_speaker_model(tmp_path, torch.device("cpu"))

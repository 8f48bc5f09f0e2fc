"""Our DAC decoder against transformers' DacModel (tiny random weights, every weight-norm layout), its
receptive field, and windowed streaming against one-shot decoding.

Tiny: latent 64, decoder width 32; kept: 9 codebooks x 1024 codes, strides [8, 8, 4, 2] (hop 512),
kernels and dilations, so the receptive field is the real model's (10 frames each side).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from dac_helpers import HOP, TINY, save, tiny_reference

from vox_serve.audio_input import resample_as_torchaudio
from vox_serve.codecs.dac.decoder import DAC_44KHZ, DacConfig, load_dac, receptive_field
from vox_serve.codecs.dac.encoder import load_dac_encoder
from vox_serve.codecs.dac.stream import chunk_window, decode_windows, gather_window
from vox_serve.rt.checkpoint import CheckpointError

pytest.importorskip("transformers")
REF_ATOL = 1e-5  # vs transformers, float32 (observed ~1e-7 at audio std ~0.3)
STREAM_ATOL = 1e-5  # windows with the full receptive field vs one-shot: summation order only

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def reference():
    return tiny_reference()


@pytest.fixture(scope="module")
def ours(reference, tmp_path_factory):
    return load_dac(save(reference, tmp_path_factory.mktemp("dac") / "fused", "fused"), torch.device("cpu"),
                    torch.float32)


def random_codes(frames: int, seed: int = 3, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, 1024, (batch, 9, frames), generator=torch.Generator().manual_seed(seed))


@pytest.mark.filterwarnings("ignore:.*weight_norm.*is deprecated:FutureWarning")
@pytest.mark.parametrize("layout", ["fused", "parametrizations", "weight_g"])
def test_decode_matches_transformers(tmp_path, layout: str) -> None:
    ref = tiny_reference(seed=5)
    codes = random_codes(12, batch=2)
    with torch.no_grad():
        want = ref.decode(audio_codes=codes).audio_values
        ours = load_dac(save(ref, tmp_path / layout, layout), torch.device("cpu"), torch.float32)
        got = ours.decode(codes)
    assert got.shape == want.shape == (2, 12 * HOP)
    assert (got - want).abs().max() < REF_ATOL


def test_real_config_geometry() -> None:
    assert DAC_44KHZ.hop_length == 512 and DAC_44KHZ.hidden_size == 1024 and DAC_44KHZ.sampling_rate == 44100
    assert receptive_field(DAC_44KHZ) == receptive_field(DacConfig(**{**TINY, "downsampling_ratios": (2, 4, 8, 8)}))


def test_receptive_field_is_tight(ours) -> None:
    """A change of frame j's latent reaches exactly the samples of frames j - after .. j + before.

    Forward-mode derivative (jvp) of the decode along a tangent at frame j: frames out of reach get exact
    zeros (nothing to sum), frames in reach a nonzero derivative. Differencing two decodes instead depends
    on rounding: the far tails (~1e-17 of the signal) vanish in float64 on some CPUs' kernels."""
    before, after = receptive_field(ours.cfg)
    codes, j = random_codes(48), 24
    wide = copy.deepcopy(ours).double()
    with torch.no_grad():
        z = wide.latents(codes)
    tangent = torch.zeros_like(z)
    tangent[:, :, j] = torch.randn(z.shape[:2], generator=torch.Generator().manual_seed(4), dtype=z.dtype)

    def decode_latents(latents: torch.Tensor) -> torch.Tensor:
        wide.latents = lambda _codes: latents
        return wide.decode(codes)

    _, derivative = torch.func.jvp(decode_latents, (z,), (tangent,))
    reach = derivative.abs()[0].view(48, HOP).amax(dim=1)
    touched = (reach > 0).nonzero().flatten().tolist()
    assert touched == list(range(j - after, j + before + 1))


def test_masked_window_equals_one_shot(ours) -> None:
    """Invalid frames on both sides of a window decode as the one-shot decode's zero padding."""
    codes = random_codes(20)
    window = torch.cat([random_codes(3, seed=8), codes, random_codes(5, seed=9)], dim=2)
    with torch.no_grad():
        want = ours.decode(codes)
        got = ours.decode(window, torch.tensor([[3, 23]]))[:, 3 * HOP : 23 * HOP]
    assert (got - want).abs().max() < STREAM_ATOL


def stream(decoder, codes: torch.Tensor, frames_per_chunk: int, lookback: int, lookahead: int) -> torch.Tensor:
    """Chunks as frames arrive one at a time, then the final ones; joined."""
    total, size, chunks, index = codes.shape[2], lookback + frames_per_chunk + lookahead, [], 0
    for known in range(1, total + 1):
        final = known == total
        while (w := chunk_window(index, known, final, frames_per_chunk=frames_per_chunk, lookback=lookback,
                                 lookahead=lookahead)) is not None:
            window = gather_window(codes[..., :known], w, size)
            pcm = decode_windows(decoder, window, torch.tensor([w.valid(size)]), lookback, frames_per_chunk)
            chunks.append(pcm[:, : (w.end - w.start) * HOP])
            index += 1
    return torch.cat(chunks, dim=1)


def test_streaming_equals_one_shot(ours) -> None:
    before, after = receptive_field(ours.cfg)
    codes = random_codes(37)
    with torch.no_grad():
        want = ours.decode(codes)
        got = stream(ours, codes, frames_per_chunk=8, lookback=before, lookahead=after)
    assert got.shape == want.shape
    assert (got - want).abs().max() < STREAM_ATOL


def test_short_lookahead_is_approximate(ours) -> None:
    """Less lookahead than the receptive field changes the samples near each chunk's end (measured, not
    bounded: random weights say nothing about the real model's error)."""
    codes = random_codes(37)
    with torch.no_grad():
        want = ours.decode(codes)
        got = stream(ours, codes, frames_per_chunk=8, lookback=10, lookahead=2)
    assert got.shape == want.shape and (got - want).abs().max() > STREAM_ATOL


def test_loader_is_strict(reference, tmp_path) -> None:
    path = save(reference, tmp_path / "ckpt", "fused")
    (path / "config.json").write_text(json.dumps({**TINY, "decoder_hidden_size": 64}))
    with pytest.raises(CheckpointError, match="wrong shapes"):
        load_dac(path, torch.device("cpu"), torch.float32)


def test_encode_matches_transformers(reference, tmp_path) -> None:
    """Residual VQ codes of random audio equal DacModel.encode's (the checkpoint's encoder + quantizer)."""
    encoder = load_dac_encoder(save(reference, tmp_path / "ckpt", "parametrizations"), torch.device("cpu"),
                               torch.float32)
    audio = 0.3 * torch.randn(2, 1, 10 * HOP, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = tiny_reference().encode(audio).audio_codes
    got = encoder.encode(audio)
    assert got.shape == want.shape == (2, 9, 10) and torch.equal(got, want)


def test_encode_clip_resamples_and_pads(reference, tmp_path) -> None:
    """A 24 kHz stereo clip: mono, 44.1 kHz, padded to whole frames, as Zonos's DACAutoencoder.preprocess."""
    encoder = load_dac_encoder(save(reference, tmp_path / "ckpt", "fused"), torch.device("cpu"), torch.float32)
    clip = 0.2 * torch.randn(2, 2400, generator=torch.Generator().manual_seed(6))
    codes = encoder.encode_clip(clip, 24000)
    resampled = resample_as_torchaudio(clip.mean(0), 24000, 44100)
    assert resampled.shape[0] == 4410 and codes.shape == (1, 9, -(-4410 // HOP))
    padded = torch.nn.functional.pad(resampled, (0, codes.shape[2] * HOP - 4410))
    assert torch.equal(codes, encoder.encode(padded[None, None]))

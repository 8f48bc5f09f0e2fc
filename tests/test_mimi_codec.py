"""Our Mimi decoder and encoder vs transformers' `MimiModel`, on the tiny CSM checkpoint's codec (written by
`CsmForConditionalGeneration.save_pretrained`: the flat `codec_model.*` file layout).

Kept from the real Mimi: 32 codebooks x 2048 codes, the 1920-sample frame, the split RVQ with projections.
Shrunk: widths and depth, and the transformer's sliding window (8 positions at 25 Hz, so 20-frame decodes
cross it many times).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from csm_helpers import reference_model

from vox_serve.codecs.mimi.decoder import MimiDecoder
from vox_serve.codecs.slots import CodecSlots
from vox_serve.models.csm.loader import load_csm_dir

REF_RTOL = 1e-5  # relative L2 error of our decode vs the reference, float32 (observed ~7e-6)
STREAM_ATOL = 2e-5  # streaming vs one-shot, float32: only summation order differs (observed ~1e-5, audio std ~5)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def codecs(tiny_csm_dir):  # noqa: ANN001, ANN201
    """(our modules, the reference's MimiModel)."""
    return load_csm_dir(tiny_csm_dir, 64), reference_model(tiny_csm_dir).codec_model


def random_codes(batch: int, frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (batch, frames, 32), generator=torch.Generator().manual_seed(seed))


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape
    return ((got - want).norm() / want.norm()).item()


def test_decode_matches_reference(codecs) -> None:
    ours, ref = codecs
    codes = random_codes(2, 20, seed=1)
    with torch.no_grad():
        want = ref.decode(codes.transpose(1, 2)).audio_values[:, 0]
    got = ours.codec.decode(codes)
    assert got.shape == (2, 20 * 1920) and ours.codec.config.samples_per_frame == 1920
    assert want.std() > 0.5  # not silence
    assert rel_error(got, want) < REF_RTOL


@pytest.mark.parametrize("chunks", [[1] * 9, [3, 4, 2], [9]])
def test_streaming_equals_one_shot(codecs, chunks: list[int]) -> None:
    dec = codecs[0].codec
    codes = random_codes(2, 9, seed=2)
    pool, slots = CodecSlots(dec, num_slots=4), torch.tensor([3, 1])
    out, start = [], 0
    for n in chunks:
        out.append(pool.decode_chunk(codes[:, start:start + n], slots))
        start += n
    assert (torch.cat(out, dim=-1) - dec.decode(codes)).abs().max() < STREAM_ATOL


def test_interleaved_requests_and_reset(codecs) -> None:
    """Two requests in their own slots, decoded in different batches, each equal its own one-shot decode; a reset
    slot starts afresh."""
    dec = codecs[0].codec
    a, b = random_codes(1, 6, seed=3), random_codes(1, 6, seed=4)
    pool = CodecSlots(dec, num_slots=3)
    first = pool.decode_chunk(torch.cat([a[:, :2], b[:, :2]]), torch.tensor([0, 2]))
    rest_a = pool.decode_chunk(a[:, 2:], torch.tensor([0]))
    rest_b = pool.decode_chunk(b[:, 2:], torch.tensor([2]))
    assert (torch.cat([first[:1], rest_a], -1) - dec.decode(a)).abs().max() < STREAM_ATOL
    assert (torch.cat([first[1:], rest_b], -1) - dec.decode(b)).abs().max() < STREAM_ATOL
    pool.reset_slot(0)
    assert (pool.decode_chunk(b, torch.tensor([0])) - dec.decode(b)).abs().max() < STREAM_ATOL


def test_output_is_causal(codecs) -> None:
    dec = codecs[0].codec
    codes = random_codes(1, 10, seed=5)
    changed = codes.clone()
    changed[:, 7:] = random_codes(1, 3, seed=6)
    full, out = dec.decode(codes), dec.decode(changed)
    assert torch.equal(out[:, :7 * 1920], full[:, :7 * 1920]) and (out - full).abs().max() > 1e-3


@pytest.mark.parametrize("samples", [24000 * 2 + 777, 1920 * 13, 500])
def test_encoder_codes_match_reference(codecs, samples: int) -> None:
    """Clips on and off the frame grid, longer than the encoder's window: the same codes, ceil(n / 1920) frames."""
    ours, ref = codecs
    audio = torch.from_numpy(np.random.default_rng(samples).uniform(-0.6, 0.6, samples).astype(np.float32))
    with torch.no_grad():
        want = ref.encode(audio[None, None]).audio_codes[0].t()
    got = ours.codec_encoder(audio)
    assert got.shape == (-(-samples // 1920), 32)
    assert torch.equal(got, want)


def test_random_decoder_is_deterministic(codecs) -> None:
    config = codecs[0].config.codec
    a, b, c = (MimiDecoder.random(config, seed=s) for s in (3, 3, 4))
    codes = random_codes(1, 4, seed=8)
    ya, yb, yc = a.decode(codes), b.decode(codes), c.decode(codes)
    assert torch.equal(ya, yb) and not torch.allclose(ya, yc)
    assert ya.shape == (1, 4 * 1920) and torch.isfinite(ya).all()
    assert a.decode(codes[:, :0]).shape == (1, 0)
    with pytest.raises(ValueError, match="expected 32 codebooks per frame, got 8"):
        a.decode(codes[..., :8])


def test_slot_pool_layout(codecs) -> None:
    pool = CodecSlots(codecs[0].codec, num_slots=2)
    layout = dict(pool.layout())
    assert layout["decoder_transformer"] == (2, 2, 1, 7, 8)  # layers, k/v, kv heads, window - 1, head dim
    assert layout["upsample"] == (16, 1)  # the x2 transposed conv: one input frame
    assert pool.state.shape == (2, sum(torch.Size(s).numel() for s in layout.values()))

"""SnacDecoder.decode(keep=...): the kept samples of a window, computed from only the columns they depend on,
equal the same samples of the whole window's decode (float64, seeded noise on), at the window's ends too."""

from __future__ import annotations

import pytest
import torch

from vox_serve.codecs.snac import SnacConfig, SnacDecoder, orpheus_frames_to_codes
from vox_serve.models.orpheus.loader import SNAC_24KHZ_CONFIG
from vox_serve.rt import codec_kernels

TINY = dict(SNAC_24KHZ_CONFIG, encoder_dim=4, decoder_dim=64, codebook_size=64)
TINY_ATTN = dict(TINY, attn_window_size=4)  # the 32/44 kHz models' local attention at the latent rate
SPF = 2048  # samples per frame of the 24 kHz geometry

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def decoder(cfg: dict) -> SnacDecoder:
    return SnacDecoder.random(SnacConfig.from_dict(cfg), seed=3).double()


def window(cfg: dict, batch: int, frames: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(frames)
    return orpheus_frames_to_codes(torch.randint(0, cfg["codebook_size"], (batch, frames, 7), generator=g))


@pytest.mark.parametrize("cfg", [TINY, TINY_ATTN], ids=["tiny", "tiny-attention"])
@pytest.mark.parametrize("keep", [(SPF, 2 * SPF), (0, SPF), (3 * SPF, 4 * SPF), (0, 4 * SPF), (5000, 5001),
                                  (SPF, 3 * SPF), (17, 8100)])
def test_kept_samples_equal_the_whole_windows(cfg: dict, keep: tuple[int, int]) -> None:
    dec, codes = decoder(cfg), window(cfg, batch=2, frames=4)
    seed, offset = torch.tensor([5, -6]), torch.tensor([0, 11])
    with torch.no_grad():
        whole = dec.decode(codes, seed, offset)
        kept = dec.decode(codes, seed, offset, keep=keep)
    assert kept.shape == (2, 1, keep[1] - keep[0])
    assert whole.std() > 1e-3
    torch.testing.assert_close(kept, whole[..., keep[0]:keep[1]], rtol=1e-12, atol=1e-12)


def test_real_geometry_streaming_window() -> None:
    """SNAC 24 kHz at its real size: Orpheus' window (lookback 1, the chunk, lookahead 2) for chunks of
    1 and 3 frames, and a first chunk without lookback (kept from the window's start)."""
    dec = decoder(SNAC_24KHZ_CONFIG)
    for frames, keep in ((4, (SPF, 2 * SPF)), (6, (SPF, 4 * SPF)), (3, (0, SPF))):
        codes = window(SNAC_24KHZ_CONFIG, batch=1, frames=frames)
        seed, offset = torch.tensor([9]), torch.tensor([frames])
        with torch.no_grad():
            whole, kept = dec.decode(codes, seed, offset), dec.decode(codes, seed, offset, keep=keep)
        torch.testing.assert_close(kept, whole[..., keep[0]:keep[1]], rtol=1e-12, atol=1e-12)


def test_the_plan_crops() -> None:
    """A one-frame chunk of a four-frame window: the audio-rate blocks read about a quarter of their input
    (what makes the cropped decode cheaper), and every span lies inside the window."""
    dec = decoder(SNAC_24KHZ_CONFIG)
    spans = dec.crop_plan(16, (SPF, 2 * SPF))
    lengths = [16, 128, 1024, 4096]
    assert all(0 <= lo < hi <= n for (lo, hi), n in zip(spans, lengths, strict=True))
    assert (spans[-1][1] - spans[-1][0]) / lengths[-1] < 0.3
    assert dec.crop_plan(16, (0, 4 * SPF)) == [(0, n) for n in lengths]


@pytest.mark.parametrize("keep", [(0, 0), (-1, 5), (0, 4 * SPF + 1), (10, 9)])
def test_keep_outside_the_window_is_refused(keep: tuple[int, int]) -> None:
    dec, codes = decoder(TINY), window(TINY, batch=1, frames=4)
    with pytest.raises(ValueError, match="outside the window"):
        dec.decode(codes, keep=keep)


def test_transpose_gemm_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """SNAC's transposed convolutions run as GEMMs on one-window launches (where that was measured faster);
    VOX_CODEC_TRANSPOSE_GEMM=0 / 1 turns that off / on at every batch, anything else is refused."""
    for value, one, many in (("", True, False), ("0", False, False), ("1", True, True)):
        monkeypatch.setattr(codec_kernels, "_switches", {})
        monkeypatch.setenv("VOX_CODEC_TRANSPOSE_GEMM", value)
        assert (codec_kernels.transpose_gemm(1), codec_kernels.transpose_gemm(16)) == (one, many), value
    monkeypatch.setattr(codec_kernels, "_switches", {})
    monkeypatch.setenv("VOX_CODEC_TRANSPOSE_GEMM", "yes")
    with pytest.raises(ValueError, match="VOX_CODEC_TRANSPOSE_GEMM"):
        codec_kernels.transpose_gemm(1)


def test_which_convolutions_take_conv_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 1x1 convolution and dense ones up to GEMM_MAX_CHANNELS outputs (from FOLD_DILATION on, up to
    GEMM_MAX_DILATED_CHANNELS), never a grouped, strided or odd-width one; VOX_CONV_GEMM=0 / 1: none / all."""
    conv = torch.nn.Conv1d

    def cases() -> list[bool]:
        return [codec_kernels.gemm_convs(c) for c in (
            conv(1024, 1536, 1), conv(96, 96, 7, dilation=3, padding=9), conv(256, 256, 7),
            conv(384, 384, 7, dilation=9, padding=27), conv(512, 512, 7, dilation=9, padding=27),
            conv(384, 384, 7), conv(768, 768, 7, dilation=9, padding=27), conv(64, 64, 7, groups=2),
            conv(64, 64, 7, stride=2), conv(40, 64, 7))]

    eligible = [True] * 7 + [False] * 3
    for value, want in (("", [True] * 5 + [False] * 5), ("0", [False] * 10), ("1", eligible)):
        monkeypatch.setattr(codec_kernels, "_switches", {})
        monkeypatch.setenv("VOX_CONV_GEMM", value)
        assert cases() == want, value

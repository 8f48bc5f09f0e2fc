"""Streaming encoders (vox_serve.formats): every format decoded by FFmpeg's own tools (ffprobe, ffmpeg),
streamed containers checked piece by piece, rates converted, speed changed without changing pitch."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from audio_checks import decode, dominant_hz, probe, tone

from vox_serve.audio import STREAMING_SIZE
from vox_serve.formats import AudioFormat, EncodeOptions, OptionError
from vox_serve.formats.encoders import make_encoder

RATE = 24000
CHUNK_BYTES = 2 * 2048 * 4  # four Orpheus frames of PCM16
PROBED = {  # format -> (ffprobe format_name, codec_name)
    "wav": ("wav", "pcm_s16le"), "pcm": ("s16le", "pcm_s16le"), "mp3": ("mp3", "mp3"), "opus": ("ogg", "opus"),
    "aac": ("aac", "aac"), "flac": ("flac", "flac"), "mulaw": ("mulaw", "pcm_mulaw"),
}


def decoded_rate(fmt: str, rate: int) -> int:
    """What a decoder gives: Opus always decodes at 48 kHz (OpusHead records the input rate)."""
    return 48000 if fmt == "opus" else rate


def encode_chunks(options: EncodeOptions, pcm: bytes) -> list[bytes]:
    """The pieces an encoder emits for `pcm` sent in CHUNK_BYTES chunks, its finish() last."""
    encoder = make_encoder(options, RATE)
    pieces = [encoder.encode(pcm[i:i + CHUNK_BYTES]) for i in range(0, len(pcm), CHUNK_BYTES)]
    return pieces + [encoder.finish()]


@pytest.mark.parametrize("fmt", [f.value for f in AudioFormat])
def test_each_format_decodes_to_the_same_tone_and_length(fmt: str, tmp_path: Path) -> None:
    options = EncodeOptions.parse(fmt)
    rate = options.output_rate(RATE)
    data = b"".join(encode_chunks(options, tone(2.0)))
    info = probe(data, tmp_path, fmt, rate)
    [stream] = info["streams"]
    assert (info["format"]["format_name"], stream["codec_name"]) == PROBED[fmt]
    assert int(stream["sample_rate"]) == decoded_rate(fmt, rate) and stream["channels"] == 1
    rate = decoded_rate(fmt, rate)
    samples = decode(data, tmp_path, fmt, rate)
    # mp3 and aac decoders keep the encoder's priming and padding (up to ~2 frames)
    assert abs(len(samples) / rate - 2.0) < 0.08, len(samples) / rate
    assert abs(dominant_hz(samples, rate) - 440.0) < 3.0
    assert 0.2 < float(abs(samples).max()) < 0.4  # amplitude 10000 / 32768, within codec error


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "mulaw", "pcm"])
def test_output_streams_while_audio_arrives(fmt: str) -> None:
    """Most bytes come out before finish(): a codec may hold a frame, the container nothing more."""
    pieces = encode_chunks(EncodeOptions.parse(fmt), tone(3.0))
    assert sum(map(len, pieces[:-1])) > 0.8 * sum(map(len, pieces))
    assert sum(1 for p in pieces[:-1] if p) >= len(pieces) // 2


def test_streamed_opus_is_whole_ogg_pages_in_every_piece() -> None:
    pieces = [p for p in encode_chunks(EncodeOptions.parse("opus"), tone(2.0)) if p]
    for piece in pieces:
        offset = 0
        while offset < len(piece):  # walk the pages: header, segment table, body
            assert piece[offset:offset + 4] == b"OggS", f"a piece cuts an Ogg page at byte {offset}"
            num_segments = piece[offset + 26]
            lacing = piece[offset + 27: offset + 27 + num_segments]
            offset += 27 + num_segments + sum(lacing)
        assert offset == len(piece)
    assert pieces[0][28:36] == b"OpusHead"


def test_streamed_aac_is_whole_adts_frames_in_every_piece() -> None:
    for piece in [p for p in encode_chunks(EncodeOptions.parse("aac"), tone(2.0)) if p]:
        offset = 0
        while offset < len(piece):
            header = piece[offset:offset + 7]
            assert header[0] == 0xFF and header[1] & 0xF0 == 0xF0, "not an ADTS sync word"
            offset += ((header[3] & 0x03) << 11) | (header[4] << 3) | (header[5] >> 5)
        assert offset == len(piece)


def test_streamed_wav_has_the_size_sentinel_and_a_whole_one_exact_sizes(tmp_path: Path) -> None:
    pcm = tone(1.0)
    streamed = b"".join(encode_chunks(EncodeOptions.parse("wav"), pcm))
    riff, data = struct.unpack("<I", streamed[4:8])[0], struct.unpack("<I", streamed[40:44])[0]
    assert riff == data == STREAMING_SIZE and streamed[44:] == pcm  # at the model's rate: untouched
    encoder = make_encoder(EncodeOptions.parse("wav"), RATE, streaming=False)
    assert encoder.encode(pcm) == b""
    whole = encoder.finish()
    assert struct.unpack("<I", whole[40:44])[0] == len(pcm) and whole[44:] == pcm
    assert float(probe(whole, tmp_path, "wav")["format"]["duration"]) == pytest.approx(1.0)


@pytest.mark.parametrize(("fmt", "rate"), [("mulaw", 8000), ("pcm", 16000), ("wav", 8000), ("mp3", 16000),
                                           ("opus", 16000), ("flac", 44100)])
def test_sample_rate_conversion(fmt: str, rate: int, tmp_path: Path) -> None:
    options = EncodeOptions.parse(fmt, sample_rate=rate)
    data = b"".join(encode_chunks(options, tone(2.0, hz=1000.0)))
    assert int(probe(data, tmp_path, fmt, rate)["streams"][0]["sample_rate"]) == decoded_rate(fmt, rate)
    if fmt == "opus":
        assert struct.unpack("<I", data[28 + 12:28 + 16])[0] == rate  # OpusHead's input sample rate
    rate = decoded_rate(fmt, rate)
    samples = decode(data, tmp_path, fmt, rate)
    assert abs(len(samples) / rate - 2.0) < 0.1  # mp3 at 16 kHz: priming and padding of 576-sample frames
    assert abs(dominant_hz(samples, rate) - 1000.0) < 3.0


def test_telephony_default_is_8khz_mulaw() -> None:
    assert EncodeOptions.parse("mulaw").output_rate(RATE) == 8000
    data = b"".join(encode_chunks(EncodeOptions.parse("mulaw"), tone(1.0)))
    assert len(data) == 8000  # one byte per sample, no header


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 4.0])
@pytest.mark.parametrize("fmt", ["pcm", "opus"])
def test_speed_changes_duration_not_pitch(speed: float, fmt: str, tmp_path: Path) -> None:
    options = EncodeOptions.parse(fmt, speed=speed)
    rate = decoded_rate(fmt, options.output_rate(RATE))
    samples = decode(b"".join(encode_chunks(options, tone(2.0))), tmp_path, fmt, rate)
    assert abs(len(samples) / rate - 2.0 / speed) < 0.06
    assert abs(dominant_hz(samples, rate) - 440.0) < 3.0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"format": "ogg"}, "response_format"), ({"speed": 0.2}, "speed"), ({"speed": 4.5}, "speed"),
    ({"speed": "fast"}, "speed"), ({"format": "opus", "sample_rate": 44100}, "sample_rate"),
    ({"sample_rate": 4000}, "sample_rate"), ({"sample_rate": 16000.5}, "sample_rate"),
    ({"sample_rate": True}, "sample_rate"),
])
def test_bad_options_name_their_field(kwargs: dict, field: str) -> None:
    with pytest.raises(OptionError) as exc:
        EncodeOptions.parse(**kwargs)
    assert exc.value.field == field

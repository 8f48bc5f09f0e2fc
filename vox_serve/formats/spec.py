"""The audio formats a client may ask for and the options that shape them (pure Python, no PyAV).

Each format has a media type, the sample rates its codec can carry, and a default rate: the
model's rate where the codec takes it, else the nearest rate it takes above it (mu-law is for
telephony: 8 kHz unless asked otherwise). `speed` stretches time without changing pitch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

MIN_SPEED, MAX_SPEED = 0.25, 4.0
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 48000
TELEPHONY_RATE = 8000


class OptionError(ValueError):
    """An output option a client got wrong; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class AudioFormat(enum.StrEnum):
    WAV = "wav"  # RIFF PCM16; streamed with the size sentinel 0xFFFFFFFF
    PCM = "pcm"  # raw little-endian int16 mono, no header
    MP3 = "mp3"
    OPUS = "opus"  # Opus in Ogg pages
    AAC = "aac"  # AAC-LC in ADTS frames
    FLAC = "flac"
    MULAW = "mulaw"  # raw G.711 mu-law bytes (telephony), no header

    @property
    def media_type(self) -> str:
        return _MEDIA_TYPES[self]

    @property
    def sample_rates(self) -> tuple[int, ...] | None:
        """The rates the codec takes (None: any rate in [MIN_SAMPLE_RATE, MAX_SAMPLE_RATE])."""
        return _RATES.get(self)

    def default_rate(self, model_rate: int) -> int:
        if self is AudioFormat.MULAW:
            return TELEPHONY_RATE
        rates = self.sample_rates
        if rates is None or model_rate in rates:
            return model_rate
        return min((r for r in rates if r >= model_rate), default=max(rates))


_MEDIA_TYPES = {
    AudioFormat.WAV: "audio/wav", AudioFormat.PCM: "audio/pcm", AudioFormat.MP3: "audio/mpeg",
    AudioFormat.OPUS: "audio/ogg", AudioFormat.AAC: "audio/aac", AudioFormat.FLAC: "audio/flac",
    AudioFormat.MULAW: "audio/basic",
}
_RATES = {
    AudioFormat.MP3: (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
    AudioFormat.OPUS: (8000, 12000, 16000, 24000, 48000),
    AudioFormat.AAC: (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
}


@dataclass(frozen=True)
class EncodeOptions:
    """What the client gets: format, sample rate (None: the format's default) and speed."""

    format: AudioFormat = AudioFormat.WAV
    sample_rate: int | None = None
    speed: float = 1.0

    @classmethod
    def parse(cls, format: object = "wav", sample_rate: object = None, speed: object = 1.0,
              format_field: str = "response_format") -> EncodeOptions:
        """Options from request values; OptionError naming the field for anything invalid."""
        try:
            fmt = AudioFormat(format)
        except ValueError:
            choices = ", ".join(f.value for f in AudioFormat)
            raise OptionError(format_field, f"{format!r} is not one of {choices}") from None
        if isinstance(speed, bool) or not isinstance(speed, int | float) or not MIN_SPEED <= speed <= MAX_SPEED:
            raise OptionError("speed", f"must be a number from {MIN_SPEED:g} to {MAX_SPEED:g}, got {speed!r}")
        if sample_rate is not None:
            _check_rate(fmt, sample_rate)
        return cls(fmt, sample_rate, float(speed))

    def output_rate(self, model_rate: int) -> int:
        return self.sample_rate or self.format.default_rate(model_rate)


def _check_rate(fmt: AudioFormat, rate: object) -> None:
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise OptionError("sample_rate", f"must be an integer number of Hz, got {rate!r}")
    rates = fmt.sample_rates
    if rates is not None and rate not in rates:
        raise OptionError("sample_rate", f"{fmt.value} takes {', '.join(map(str, rates))} Hz, not {rate}")
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise OptionError("sample_rate", f"must be {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz, got {rate}")

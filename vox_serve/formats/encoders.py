"""Streaming encoders: PCM16 mono chunks in, the bytes of the chosen format out, as they are produced.

    encoder = make_encoder(options, model_rate)
    for pcm in chunks: send(encoder.encode(pcm))     # may be b"" while a codec fills a frame
    send(encoder.finish())                            # the codec's tail and the container's end

Every non-trivial step is FFmpeg through PyAV: `atempo` for speed (pitch kept; chained for factors
below 0.5), libswresample for rate and sample-format conversion, and the codecs and muxers (LAME
for mp3, libopus in Ogg, FFmpeg's AAC in ADTS, FLAC, G.711 mu-law). Containers are written to a
non-seekable sink, so nothing is patched after the fact: Ogg pages are flushed every
OGG_PAGE_DURATION_US, ADTS and MP3 frames stand alone, FLAC's STREAMINFO leaves the length unknown,
and a streamed WAV carries the size sentinel (a whole one, `streaming=False`, gets exact sizes).
WAV and PCM at the model's rate and speed 1 pass the samples through untouched.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Protocol

import numpy as np

from vox_serve.audio import wav_bytes, wav_header
from vox_serve.formats.spec import AudioFormat, EncodeOptions

OGG_PAGE_DURATION_US = 20_000  # one Opus frame per page: the muxer's default (1 s) would hold audio back
MAX_ATEMPO, MIN_ATEMPO = 2.0, 0.5  # one atempo filter's range; other factors chain several
# format -> (muxer, codec, bit rate); None keeps the codec's default
_CODECS: dict[AudioFormat, tuple[str, str, int | None]] = {
    AudioFormat.MP3: ("mp3", "libmp3lame", 64_000),
    AudioFormat.OPUS: ("ogg", "libopus", 32_000),
    AudioFormat.AAC: ("adts", "aac", 64_000),
    AudioFormat.FLAC: ("flac", "flac", None),
    AudioFormat.MULAW: ("mulaw", "pcm_mulaw", None),
}


class Encoder(Protocol):
    media_type: str
    in_thread: bool  # worth a worker thread (a codec runs); False when it only copies bytes

    def encode(self, pcm16: bytes) -> bytes:
        """The output bytes that `pcm16` (little-endian int16 mono at the model's rate) completes."""

    def finish(self) -> bytes:
        """Everything still held (codec delay, the container's end); call once, last."""


def make_encoder(options: EncodeOptions, model_rate: int, streaming: bool = True) -> Encoder:
    rate = options.output_rate(model_rate)
    if options.format in (AudioFormat.WAV, AudioFormat.PCM):
        wav = options.format is AudioFormat.WAV
        if rate == model_rate and options.speed == 1.0:
            return PcmEncoder(None, rate, wav, streaming)
        return PcmEncoder(_Pipeline(model_rate, rate, options.speed), rate, wav, streaming)
    return ContainerEncoder(options.format, _Pipeline(model_rate, rate, options.speed), rate)


class _Sink:
    """A write-only, non-seekable file for PyAV's muxers: what they write is taken after each call."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        return len(data)

    def seekable(self) -> bool:
        return False

    def take(self) -> bytes:
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


class _Pipeline:
    """PCM16 bytes at the model's rate -> s16 mono frames at `rate`, `speed` times faster."""

    def __init__(self, in_rate: int, rate: int, speed: float) -> None:
        import av

        self._av, self.in_rate = av, in_rate
        self._pts = 0
        self._graph = _atempo_graph(av, in_rate, speed) if speed != 1.0 else None
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)

    def frames(self, pcm16: bytes | None) -> list:
        """The frames that `pcm16` completes; None flushes the filters."""
        stretched = self._stretch(self._frame(pcm16) if pcm16 is not None else None)
        out = [f for frame in stretched for f in self._resampler.resample(frame)]
        if pcm16 is None:
            out += self._resampler.resample(None)
        return out

    def _frame(self, pcm16: bytes):  # noqa: ANN202 (an av.AudioFrame)
        samples = np.frombuffer(pcm16, dtype="<i2").reshape(1, -1)
        frame = self._av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate, frame.time_base, frame.pts = self.in_rate, Fraction(1, self.in_rate), self._pts
        self._pts += samples.shape[1]
        return frame

    def _stretch(self, frame) -> list:  # noqa: ANN001
        if self._graph is None:
            return [frame] if frame is not None else []
        _, source, sink = self._graph
        source.push(frame)
        out = []
        while True:
            try:
                out.append(sink.pull())
            except (self._av.BlockingIOError, self._av.EOFError):
                return out


def _atempo_graph(av, rate: int, speed: float) -> tuple:  # noqa: ANN001
    """(graph, source, sink) of an FFmpeg filter graph that plays `speed` times faster at the same pitch
    (the graph must outlive its nodes)."""
    graph = av.filter.Graph()
    source = graph.add_abuffer(format="s16", sample_rate=rate, layout="mono", time_base=Fraction(1, rate))
    nodes, left = [source], speed
    while left < MIN_ATEMPO:
        nodes.append(graph.add("atempo", str(MIN_ATEMPO)))
        left /= MIN_ATEMPO
    while left > MAX_ATEMPO:
        nodes.append(graph.add("atempo", str(MAX_ATEMPO)))
        left /= MAX_ATEMPO
    sink = graph.add("abuffersink")
    graph.link_nodes(*nodes, graph.add("atempo", f"{left:.6f}"), sink).configure()
    return graph, source, sink


class PcmEncoder:
    """Raw PCM16, or WAV: streamed with the size sentinel, or (streaming=False) whole with exact sizes."""

    def __init__(self, pipeline: _Pipeline | None, rate: int, wav: bool, streaming: bool) -> None:
        self.pipeline, self.rate, self.wav, self.streaming = pipeline, rate, wav, streaming
        self.media_type = (AudioFormat.WAV if wav else AudioFormat.PCM).media_type
        self.in_thread = pipeline is not None
        self._header = wav_header(rate, None) if wav and streaming else b""
        self._held: list[bytes] = []  # a whole WAV waits for its length

    def encode(self, pcm16: bytes) -> bytes:
        return self._emit(self._convert(pcm16))

    def finish(self) -> bytes:
        tail = self._convert(None)
        if self.wav and not self.streaming:
            return wav_bytes(b"".join(self._held) + tail, self.rate)
        return self._emit(tail)

    def _convert(self, pcm16: bytes | None) -> bytes:
        if self.pipeline is None:
            return pcm16 or b""
        return b"".join(bytes(f.planes[0])[: f.samples * 2] for f in self.pipeline.frames(pcm16))

    def _emit(self, data: bytes) -> bytes:
        if self.wav and not self.streaming:
            self._held.append(data)
            return b""
        out, self._header = self._header + data, b""
        return out


class ContainerEncoder:
    """An FFmpeg codec in its streaming container, written as it goes."""

    def __init__(self, fmt: AudioFormat, pipeline: _Pipeline, rate: int) -> None:
        import av

        muxer, codec, bit_rate = _CODECS[fmt]
        self.media_type, self.pipeline = fmt.media_type, pipeline
        self.in_thread = True
        self._sink = _Sink()
        options = {"page_duration": str(OGG_PAGE_DURATION_US)} if muxer == "ogg" else {}
        self._container = av.open(self._sink, mode="w", format=muxer, options=options)
        self._stream = self._container.add_stream(codec, rate=rate, layout="mono")
        if bit_rate is not None:
            self._stream.bit_rate = bit_rate

    def encode(self, pcm16: bytes) -> bytes:
        self._mux(self.pipeline.frames(pcm16))
        return self._sink.take()

    def finish(self) -> bytes:
        self._mux([*self.pipeline.frames(None), None])
        self._container.close()
        return self._sink.take()

    def _mux(self, frames: list) -> None:
        for frame in frames:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)

"""Audio formats of the speech routes: streaming encoders from PCM16 mono chunks to wav, pcm, mp3,
opus (Ogg), aac (ADTS), flac and mu-law, with sample-rate conversion and pitch-preserving speed.

`spec` (pure Python) names the formats and checks the options; `encoders` builds the encoders
(PyAV, i.e. FFmpeg's codecs and muxers, for everything but WAV/PCM at the model's rate).
"""

from vox_serve.formats.spec import AudioFormat, EncodeOptions, OptionError

__all__ = ["AudioFormat", "EncodeOptions", "OptionError"]

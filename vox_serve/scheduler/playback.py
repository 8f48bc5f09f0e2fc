"""The client's playback clock as the scheduler sees it (pure Python).

A client starts playing when its first chunk arrives and then plays without pausing, so it runs
out of audio at `first_audio + audio sent so far`. This is the same timeline as the viability
metric (vox_serve/metrics.py): chunk i is on time when it arrives before the audio sent before it
has been played.
"""

from __future__ import annotations

from vox_serve.core.request import Request


def audio_seconds(req: Request, sample_rate: int) -> float:
    """Audio sent to the client so far, in seconds."""
    return req.stats.num_audio_samples / sample_rate


def playback_deadline(req: Request, sample_rate: int) -> float | None:
    """When the client runs out of audio (the deadline of the next chunk); None before the first chunk."""
    if req.stats.first_audio is None:
        return None
    return req.stats.first_audio + audio_seconds(req, sample_rate)


def last_chunk_play_start(req: Request, sample_rate: int) -> float | None:
    """When the client starts playing the last chunk it has received; None before the first chunk."""
    if req.stats.first_audio is None:
        return None
    played_before = req.stats.num_audio_samples - req.stats.last_chunk_samples
    return req.stats.first_audio + played_before / sample_rate


PLAYBACK_MARGIN_S = 1.0
"""How far ahead of a client's playback the `online` and `deadline` policies decode audio: a chunk
becomes pressing a second before the client starts playing the last chunk it has received."""

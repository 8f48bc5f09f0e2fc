"""A Python client of a running vox-serve server: speech (whole or streamed), saved voices, and the
WebSocket session that takes text in pieces. `VoxClient` is synchronous, `AsyncVoxClient` asyncio.

    from vox_serve.client import VoxClient
    with VoxClient("http://127.0.0.1:8000") as client:
        open("hello.mp3", "wb").write(client.speech("Hello there!", format="mp3"))
        for piece in client.stream_speech("Streaming, as it is produced.", format="pcm"):
            play(piece)
        with client.session(format="pcm") as session:
            session.send("Text from an LLM, ")
            session.send("piece by piece.")
            session.end()
            for chunk in session:
                play(chunk.data)
"""

from vox_serve.client.errors import VoxError
from vox_serve.client.http import AsyncVoxClient, VoxClient
from vox_serve.client.ws import AsyncSpeechSession, AudioChunk, SpeechSession

__all__ = ["AsyncSpeechSession", "AsyncVoxClient", "AudioChunk", "SpeechSession", "VoxClient", "VoxError"]

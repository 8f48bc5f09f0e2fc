"""Messages between the API process and the scheduler processes: typed, versioned, msgpack-encoded.

One message is one ZMQ multipart message:

    frame 0     msgpack map {"v": PROTOCOL_VERSION, "t": <message type>, "f": {<other fields>}}
    frame 1..   one raw frame per binary field (PCM audio, uploaded audio), in field order

A replica sends the audio of a step as one AudioBatch (every chunk of the step, for any requests, in one
frame), which `request_events` splits into per-request Audio messages on the API side.
Text travels inside msgpack strings and is never joined or split on a delimiter. A message of an
unknown version or type, with unknown or missing fields, raises ProtocolError; nothing is guessed.
Plain Python only (no torch), so the API process can import it.
"""

from __future__ import annotations

import enum
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

import msgpack

from vox_serve.core.meta import EngineLimits, ProgramMeta

PROTOCOL_VERSION = 2  # 2: AudioBatch

_TYPES: dict[str, type] = {}
_BINARY = "binary"
M = TypeVar("M")


class ProtocolError(ValueError):
    """Frames that are not a message of this protocol version."""


class ErrorCode(enum.StrEnum):
    """Why a request failed; the API maps each to an HTTP status."""

    INVALID_FIELD = "invalid_field"  # a field the model cannot take (names the field)
    QUEUE_FULL = "queue_full"  # --max-queued-requests requests are already waiting
    UNSUPPORTED = "unsupported"  # e.g. input streaming on a model without it
    INTERNAL = "internal"  # a step failed
    STALLED = "stalled"  # the request could never be admitted
    REPLICA_DIED = "replica_died"  # set by the API when a scheduler process exits
    TIMEOUT = "timeout"  # set by the API past --request-timeout-s


def binary(default: bytes = b"") -> Any:
    """A bytes field sent as its own frame (never msgpack-encoded inside the header)."""
    return field(default=default, metadata={_BINARY: True})


def message(cls: type[M]) -> type[M]:
    """Register a frozen dataclass as a message type under its class name."""
    cls = dataclass(frozen=True)(cls)
    _TYPES[cls.__name__] = cls
    return cls


# ---- API -> scheduler -----------------------------------------------------------------------
@message
class Submit:
    """A new request (or, with input_streaming, a session whose text follows in AppendText)."""

    req_id: str
    fields: dict[str, Any]  # validated request fields (text, voice, sampling overrides, ...)
    default_seed: int  # used when the fields carry no seed
    input_streaming: bool = False
    audio: bytes = binary()  # uploaded reference audio; empty when none
    voice_prompt: bytes = binary()  # a saved voice's cloning prompt (voice_prompt.VoicePrompt bytes); empty when none


@message
class EncodeVoice:
    """Compute a cloning prompt from reference audio (POST /v1/audio/voices); answered by VoiceEncoded."""

    req_id: str
    name: str
    created_at: int  # Unix seconds
    ref_text: str | None  # the clip's transcript: in-context cloning; None: speaker embedding only
    audio: bytes = binary()


@message
class AppendText:
    req_id: str
    text: str


@message
class EndText:
    req_id: str


@message
class Abort:
    req_id: str
    reason: str


@message
class Shutdown:
    pass


# ---- scheduler -> API -----------------------------------------------------------------------
@message
class Ready:
    replica: int
    incarnation: int
    pid: int
    device: str
    meta: dict[str, Any]  # ProgramMeta.to_dict()
    limits: dict[str, Any]  # EngineLimits as a dict


@message
class Fatal:
    """The scheduler process cannot start (bad checkpoint, no device); it exits after sending this."""

    replica: int
    incarnation: int
    message: str


@message
class Heartbeat:
    """Sent every STATS_INTERVAL_S by the replica's heartbeat thread, during steps too: a replica that
    stops sending is frozen; `step_s` says how long the step now running has run (0 between steps)."""

    replica: int
    incarnation: int
    step_s: float


@message
class Stats:
    """Load and pool occupancy, sent periodically: the heartbeat of a live replica."""

    replica: int
    incarnation: int
    num_active: int  # requests the scheduler holds (waiting, running, draining)
    num_waiting: int
    num_sessions: int  # input-streaming sessions still receiving text
    pools: dict[str, list[int]]  # pool name -> [free, total] (KV pages, codec slots)
    num_finished: int
    num_aborted: int
    num_failed: int
    num_steps: int
    num_running: int = 0  # admitted requests generating tokens
    # stage -> [launches, seconds, launches per stage_stats.STAGE_BUCKETS_S bucket and +Inf], cumulative
    stage_times: dict[str, list[float]] = field(default_factory=dict)


@message
class Started:
    """The request is queued on the replica (for a session: the session exists)."""

    req_id: str
    prompt_len: int


@message
class Audio:
    req_id: str
    chunk_index: int
    pcm: bytes | memoryview = binary()  # little-endian int16 mono at the model's sample rate (bytes once decoded)


@message
class AudioBatch:
    """The audio chunks of one step, for any requests, in one message: the chunks' PCM back to back in one frame
    (`sizes`: bytes of each). One message a step instead of one a chunk (each costs the replica's loop
    ~15-20 us: hundreds of microseconds a step at hundreds of streams). `request_events` splits it."""

    req_ids: list[str]
    chunk_index: list[int]
    sizes: list[int]
    pcm: bytes = binary()


@message
class Finished:
    req_id: str
    reason: str  # stop | length
    num_tokens: int
    num_samples: int


@message
class Failed:
    req_id: str
    code: str  # an ErrorCode
    message: str
    field: str | None = None  # the request field at fault, when there is one


@message
class VoiceEncoded:
    req_id: str
    prompt: bytes = binary()  # the saved voice's file: voice_prompt.VoicePrompt.to_bytes()


REQUEST_EVENTS = (Started, Audio, Finished, Failed, VoiceEncoded)


def request_events(msg: Any) -> list[Any]:
    """The messages `msg` carries for the API's request handles: an AudioBatch's chunks as Audio messages (in
    order), any other message as it is. ProtocolError for a batch whose lists or sizes disagree."""
    if not isinstance(msg, AudioBatch):
        return [msg]
    n = len(msg.req_ids)
    if len(msg.chunk_index) != n or len(msg.sizes) != n or any(s < 0 for s in msg.sizes) \
            or sum(msg.sizes) != len(msg.pcm):
        raise ProtocolError(f"AudioBatch of {n} chunks: {len(msg.chunk_index)} indices, {len(msg.sizes)} sizes "
                            f"summing to {sum(msg.sizes)} bytes, {len(msg.pcm)} bytes of PCM")
    out, start = [], 0
    for req_id, index, size in zip(msg.req_ids, msg.chunk_index, msg.sizes, strict=True):
        out.append(Audio(req_id, index, msg.pcm[start : start + size]))
        start += size
    return out


class AudioOutbox:
    """A step's audio chunks, collected to be sent as one AudioBatch."""

    def __init__(self) -> None:
        self.req_ids: list[str] = []
        self.chunk_index: list[int] = []
        self.chunks: list[bytes | memoryview] = []

    def __len__(self) -> int:
        return len(self.chunks)

    def add(self, req_id: str, chunk_index: int, pcm: bytes | memoryview) -> None:
        self.req_ids.append(req_id)
        self.chunk_index.append(chunk_index)
        self.chunks.append(pcm)

    def take(self) -> AudioBatch:
        """The batch of everything added (one copy of the PCM), leaving the outbox empty."""
        batch = AudioBatch(self.req_ids, self.chunk_index, [len(c) for c in self.chunks], b"".join(self.chunks))
        self.req_ids, self.chunk_index, self.chunks = [], [], []
        return batch


def _binary_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls) if f.metadata.get(_BINARY)]


def encode(msg: Any) -> list[bytes | memoryview]:
    """The frames of a message (a binary field's bytes or memoryview is a frame as it is: no copy)."""
    cls = type(msg)
    if _TYPES.get(cls.__name__) is not cls:
        raise ProtocolError(f"{cls.__name__} is not a message type")
    binaries = _binary_names(cls)
    header = {f.name: getattr(msg, f.name) for f in fields(cls) if f.name not in binaries}
    frames = [msgpack.packb({"v": PROTOCOL_VERSION, "t": cls.__name__, "f": header}, use_bin_type=True)]
    frames += [_frame(getattr(msg, name)) for name in binaries]
    return frames


def _frame(value: Any) -> bytes | memoryview:
    return value if isinstance(value, bytes | memoryview) else bytes(value)


def decode(frames: list[bytes]) -> Any:
    """The message in `frames`; raises ProtocolError for anything else."""
    if not frames:
        raise ProtocolError("empty message")
    try:
        head = msgpack.unpackb(frames[0], raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise ProtocolError(f"header is not msgpack: {exc}") from exc
    if not isinstance(head, dict) or set(head) != {"v", "t", "f"} or not isinstance(head["f"], dict):
        raise ProtocolError("header must be a map of v, t and f")
    if head["v"] != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {head['v']!r}; this build speaks {PROTOCOL_VERSION}")
    cls = _TYPES.get(head["t"]) if isinstance(head["t"], str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {head['t']!r}")
    binaries = _binary_names(cls)
    if len(frames) != 1 + len(binaries):
        raise ProtocolError(f"{cls.__name__} has {len(binaries)} binary frames, got {len(frames) - 1}")
    values = dict(head["f"])
    _check_fields(cls, values, binaries)
    values.update({name: bytes(frame) for name, frame in zip(binaries, frames[1:], strict=True)})
    return cls(**values)


def _check_fields(cls: type, values: dict[str, Any], binaries: list[str]) -> None:
    names = {f.name for f in fields(cls)} - set(binaries)
    unknown = set(values) - names
    if unknown:
        raise ProtocolError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    missing = required - set(values) - set(binaries)
    if missing:
        raise ProtocolError(f"{cls.__name__}: missing fields {sorted(missing)}")


def meta_from_dict(data: dict[str, Any]) -> ProgramMeta:
    """ProgramMeta from `to_dict()` output that crossed msgpack."""
    return ProgramMeta.from_dict(data)


def limits_from_dict(data: dict[str, Any]) -> EngineLimits:
    return EngineLimits(**data)

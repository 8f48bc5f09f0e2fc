"""The API <-> scheduler message protocol, the documented field ranges, and the server's flags."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from vox_serve import ipc
from vox_serve.api.body import validate_fields
from vox_serve.api.schemas import REQUEST_FIELDS
from vox_serve.cli import CliError, build_config, check_flags, given_flags
from vox_serve.config import VoxConfig
from vox_serve.core.meta import EngineLimits
from vox_serve.core.request import SamplingParams
from vox_serve.models.orpheus.program import orpheus_meta

TRICKY_TEXT = 'a|b\nc\x00d,;\t"quoted" ünïcødé 🎤 \r\n  trailing  '
MESSAGES = [
    ipc.Submit("r1", {"text": TRICKY_TEXT, "temperature": 0.5, "seed": 2**62}, 7, False, b"RIFF\x00\xff"),
    ipc.Submit("r2", {"text": "x"}, 0, True),
    ipc.Submit("r3", {"text": "x"}, 0, False, b"", b"a saved voice's prompt"),
    ipc.EncodeVoice("v1", "alice", 1700000000, "A clip.", b"RIFF\x00\xff"),
    ipc.VoiceEncoded("v1", b"\x10\x00prompt"),
    ipc.AppendText("r2", TRICKY_TEXT),
    ipc.EndText("r2"),
    ipc.Abort("r1", "the client disconnected"),
    ipc.Shutdown(),
    ipc.Ready(0, 1, 1234, "cpu", {"name": "m"}, {"max_batch": 4}),
    ipc.Fatal(1, 2, "no such checkpoint"),
    ipc.Stats(0, 1, 2, 1, 0, {"kv_pages": [10, 12]}, 3, 4, 5, 6),
    ipc.Stats(0, 1, 2, 1, 0, {"kv_pages": [10, 12]}, 3, 4, 5, 6, num_running=1,
              stage_times={"decode": [2, 0.01, 1, 1, 0]}),
    ipc.Started("r1", 17),
    ipc.Audio("r1", 3, bytes(range(256)) * 8),
    ipc.AudioBatch(["r1", "r2"], [3, 0], [4, 2], b"\x00\x01\x02\x03\x04\x05"),
    ipc.Finished("r1", "stop", 35, 4096),
    ipc.Failed("r1", str(ipc.ErrorCode.INVALID_FIELD), "voice: unknown", "voice"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_unchanged(msg: object) -> None:
    assert ipc.decode(ipc.encode(msg)) == msg


def test_text_is_carried_exactly_and_binary_fields_travel_as_frames() -> None:
    pcm = b"\x00\x7f" * 10_000
    frames = ipc.encode(ipc.Audio("r", 0, pcm))
    assert len(frames) == 2 and frames[1] == pcm and len(frames[0]) < 100
    assert ipc.decode(ipc.encode(ipc.AppendText("r", TRICKY_TEXT))).text == TRICKY_TEXT
    assert len(ipc.encode(ipc.Submit("r", {"text": TRICKY_TEXT}, 0))) == 3  # audio and voice frames, empty


def test_an_audio_batch_splits_into_its_chunks_in_order() -> None:
    outbox = ipc.AudioOutbox()
    outbox.add("a", 0, b"\x01\x02")
    outbox.add("b", 4, memoryview(b"\x03\x04\x05\x06"))
    outbox.add("a", 1, b"")
    batch = ipc.decode([bytes(f) for f in ipc.encode(outbox.take())])
    assert len(outbox) == 0 and batch.sizes == [2, 4, 0]
    assert ipc.request_events(batch) == [ipc.Audio("a", 0, b"\x01\x02"), ipc.Audio("b", 4, b"\x03\x04\x05\x06"),
                                         ipc.Audio("a", 1, b"")]
    assert ipc.request_events(ipc.EndText("a")) == [ipc.EndText("a")]
    with pytest.raises(ipc.ProtocolError, match="AudioBatch of 2 chunks"):
        ipc.request_events(ipc.AudioBatch(["a", "b"], [0, 0], [2, 3], b"\x00" * 4))
    with pytest.raises(ipc.ProtocolError, match="1 indices"):
        ipc.request_events(ipc.AudioBatch(["a", "b"], [0], [2, 2], b"\x00" * 4))


def test_a_memoryview_chunk_is_its_own_frame_without_a_copy() -> None:
    """The engine hands out a step's chunks as views of one copy; encoding sends each as it is."""
    block = memoryview(bytes(range(200)))
    view = block[40:140]
    frames = ipc.encode(ipc.Audio("r", 3, view))
    assert frames[1] is view
    assert ipc.decode([bytes(f) for f in frames]) == ipc.Audio("r", 3, bytes(range(40, 140)))


def _header(v: object = ipc.PROTOCOL_VERSION, t: object = "EndText", f: object = None) -> bytes:
    return msgpack.packb({"v": v, "t": t, "f": {"req_id": "r"} if f is None else f})


@pytest.mark.parametrize("frames,match", [
    ([], "empty"),
    ([b"\xc1not msgpack"], "not msgpack"),
    ([msgpack.packb([1, 2])], "map of v, t and f"),
    ([_header(v=ipc.PROTOCOL_VERSION + 1)], "protocol version"),
    ([_header(t="Explode")], "unknown message type"),
    ([_header(f={"req_id": "r", "extra": 1})], "unknown fields"),
    ([_header(t="AppendText")], "missing fields"),
    ([_header(), b"stray frame"], "binary frames"),
    ([_header(t="Audio", f={"req_id": "r", "chunk_index": 0})], "binary frames"),
])
def test_malformed_messages_are_refused(frames: list[bytes], match: str) -> None:
    with pytest.raises(ipc.ProtocolError, match=match):
        ipc.decode(frames)


def test_meta_and_limits_survive_msgpack() -> None:
    meta = dataclasses.replace(orpheus_meta("orpheus-tiny", 4096, True), languages=("en", "de"))
    limits = EngineLimits(4, 256, 4, 8, 1, 65, 16, 4096)
    ready = ipc.decode(ipc.encode(ipc.Ready(0, 1, 1, "cpu", meta.to_dict(), dataclasses.asdict(limits))))
    assert ipc.meta_from_dict(ready.meta) == meta and ipc.limits_from_dict(ready.limits) == limits


@pytest.mark.parametrize("name", [n for n, d in REQUEST_FIELDS.items() if d.bounds])
def test_documented_ranges_equal_what_sampling_params_accepts(name: str) -> None:
    """What the API takes: SamplingParams' ranges (a model's own fields declare theirs), and
    integers that fit the 64 bits they travel in."""
    meta = orpheus_meta("orpheus-tiny", 4096, True)
    if name not in meta.accepted_fields:  # a model field: a meta that takes it
        meta = dataclasses.replace(meta, accepted_fields=(*meta.accepted_fields, name))

    def ok(value: float) -> bool:
        try:
            validate_fields(meta, {"text": "hi", name: value})
        except ValueError:
            return False
        return True

    bounds = REQUEST_FIELDS[name].bounds
    step = 1 if REQUEST_FIELDS[name].kind == "integer" else 1e-6
    for key, edge in bounds.items():
        inside = 1 if "min" in key.lower() else -1
        if key.startswith("exclusive"):
            assert not ok(edge) and ok(edge + inside * step), (key, edge)
        else:
            assert ok(edge) and not ok(edge - inside * step), (key, edge)
    if not any("max" in k.lower() for k in bounds):
        assert ok(10**6)


def test_sampling_fields_are_documented_with_their_types() -> None:
    kinds = {"float": "number", "int": "integer", "bool": "boolean"}
    for f in dataclasses.fields(SamplingParams):
        if f.name in REQUEST_FIELDS:
            assert REQUEST_FIELDS[f.name].kind == kinds[str(f.type)], f.name


def _config(*argv: str) -> VoxConfig:
    kept, _ = check_flags(given_flags(list(argv)), "python", rust_missing=True)
    return build_config(kept, "python")


def test_server_flags_reach_the_config_and_survive_the_trip_to_a_replica() -> None:
    config = _config("--dp-size", "2", "--request-timeout-s", "7.5", "--max-upload-mb", "3", "--port", "9")
    assert (config.server.dp_size, config.server.request_timeout_s, config.server.max_upload_mb) == (2, 7.5, 3)
    assert VoxConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("argv,match", [
    (["--dp-size", "0"], "--dp-size must be >= 1"),
    (["--dp-size", "2", "--bench-requests", "1"], "one replica"),
    (["--dp-size", "2", "--device", "cuda:1"], "names one GPU"),
    (["--request-timeout-s", "0"], "--request-timeout-s must be > 0"),
    (["--max-upload-mb", "-1"], "--max-upload-mb must be > 0"),
    (["--max-queued-requests", "-1"], "--max-queued-requests must be >= 0"),
])
def test_bad_server_flags_are_rejected(argv: list[str], match: str) -> None:
    with pytest.raises(CliError, match=match):
        _config(*argv)

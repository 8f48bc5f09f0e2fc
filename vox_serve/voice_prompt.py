"""A saved voice's cloning prompt, and its file format (pure Python: the API process reads it too).

The prompt is what a voice-cloning model computes from a reference clip before it can speak in that
voice: the speaker embedding, and, for in-context cloning, the clip's codec frames and transcript.
Computing it once (POST /v1/audio/voices) lets every later request skip the encoders.

File format: safetensors (a JSON header, then raw little-endian tensors; nothing is executed on
load), tensors `speaker` (F32 [dim]) and optionally `ref_codes` (I32 [frames, groups]), with string
metadata: `format`, `version`, `name`, `model`, `created_at`, `mode`, `ref_text` (in-context only)
and `sha256` of the tensor bytes, so a damaged file is detected, not used.
"""

from __future__ import annotations

import array
import hashlib
import json
import struct
import sys
from dataclasses import dataclass

FORMAT, VERSION = "vox-serve-voice", "1"
SAVED_VOICE_FIELD = "saved_voice"  # where a program's preprocess finds a saved voice's VoicePrompt
MAX_HEADER_BYTES = 1 << 16
_DTYPES = {"F32": "f", "I32": "i"}


class VoiceFileError(ValueError):
    """Bytes that are not a valid saved voice; the message says what is wrong."""


@dataclass(frozen=True)
class VoicePrompt:
    speaker: list[float]  # [dim] speaker embedding
    ref_codes: list[list[int]] | None = None  # [frames][groups] reference codec frames (in-context cloning)
    ref_text: str | None = None  # the reference clip's transcript (in-context cloning)

    @property
    def mode(self) -> str:
        return "x_vector" if self.ref_codes is None else "in_context"

    def to_bytes(self, name: str, model: str, created_at: int) -> bytes:
        tensors = {"speaker": ("F32", [len(self.speaker)], _pack("f", self.speaker))}
        if self.ref_codes is not None:
            groups = len(self.ref_codes[0]) if self.ref_codes else 0
            flat = [c for frame in self.ref_codes for c in frame]
            tensors["ref_codes"] = ("I32", [len(self.ref_codes), groups], _pack("i", flat))
        meta = {"format": FORMAT, "version": VERSION, "name": name, "model": model,
                "created_at": str(created_at), "mode": self.mode,
                "sha256": hashlib.sha256(b"".join(t[2] for t in tensors.values())).hexdigest()}
        if self.ref_text is not None:
            meta["ref_text"] = self.ref_text
        return _write(tensors, meta)

    @classmethod
    def from_bytes(cls, data: bytes) -> VoicePrompt:
        meta, tensors = read_voice_file(data)
        speaker = list(_unpack("f", tensors["speaker"][1]))
        codes = tensors.get("ref_codes")
        ref_codes = None
        if codes is not None:
            (frames, groups), flat = codes[0], list(_unpack("i", codes[1]))
            ref_codes = [flat[i * groups:(i + 1) * groups] for i in range(frames)]
        return cls(speaker, ref_codes, meta.get("ref_text"))


def _pack(code: str, values: list) -> bytes:
    data = array.array(code, values)
    if sys.byteorder != "little":
        data.byteswap()
    return data.tobytes()


def _unpack(code: str, raw: bytes) -> array.array:
    data = array.array(code)
    data.frombytes(raw)
    if sys.byteorder != "little":
        data.byteswap()
    return data


def _write(tensors: dict[str, tuple[str, list[int], bytes]], meta: dict[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": meta}
    offset = 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the data to 8 bytes
    return struct.pack("<Q", len(text)) + text + b"".join(t[2] for t in tensors.values())


def read_voice_file(data: bytes) -> tuple[dict[str, str], dict[str, tuple[list[int], bytes]]]:
    """(metadata, tensor name -> (shape, raw bytes)) of a saved voice; VoiceFileError if it is not one."""
    if len(data) < 8:
        raise VoiceFileError("shorter than a safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > MAX_HEADER_BYTES or 8 + size > len(data):
        raise VoiceFileError(f"header of {size} bytes does not fit the file")
    try:
        header = json.loads(data[8:8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VoiceFileError(f"header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise VoiceFileError("header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise VoiceFileError(f"not a {FORMAT} version {VERSION} file")
    body = data[8 + size:]
    tensors = {name: _tensor(name, spec, body) for name, spec in header.items()}
    if set(tensors) - {"speaker", "ref_codes"} or "speaker" not in tensors:
        raise VoiceFileError(f"unexpected tensors {sorted(tensors)}")
    if hashlib.sha256(b"".join(raw for _, raw in tensors.values())).hexdigest() != meta.get("sha256"):
        raise VoiceFileError("the tensor data does not match its checksum")
    return meta, tensors


def _tensor(name: str, spec: object, body: bytes) -> tuple[list[int], bytes]:
    expected = {"speaker": ("F32", 1), "ref_codes": ("I32", 2)}.get(name)
    if expected is None or not isinstance(spec, dict):
        raise VoiceFileError(f"unexpected tensor {name!r}")
    shape, offsets = spec.get("shape"), spec.get("data_offsets")
    if spec.get("dtype") != expected[0] or not isinstance(shape, list) or len(shape) != expected[1]:
        raise VoiceFileError(f"tensor {name!r} must be {expected[0]} with {expected[1]} dimension(s)")
    if not all(isinstance(n, int) and n >= 0 for n in shape) or not isinstance(offsets, list) or len(offsets) != 2:
        raise VoiceFileError(f"tensor {name!r} has a malformed shape or offsets")
    start, end = offsets
    count = 1
    for n in shape:
        count *= n
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= len(body)
            and end - start == 4 * count):
        raise VoiceFileError(f"tensor {name!r}: its offsets do not fit its shape or the file")
    return shape, body[start:end]

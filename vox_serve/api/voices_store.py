"""Saved voices on disk: `<data-dir>/voices/<model>/<name>.safetensors` (format: voice_prompt.py).

Opened once at start-up: every file is read and checked (header, shapes, checksum), and a damaged
one stops the server with a message naming it, rather than failing requests later. Leftovers of a
write that crashed (`*.tmp`) are removed. A write goes to a temporary file that is synced and then
renamed into place (a voice is either wholly there or absent), under a lock that also keeps out a
second server sharing the directory; a name that exists is refused, never overwritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vox_serve.voice_prompt import VoiceFileError, read_voice_file

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_VOICES_PER_MODEL = 1000
MAX_FILE_BYTES = 4 << 20  # a 60 s in-context prompt of 16 code groups is ~50 KB
SUFFIX, TMP_SUFFIX = ".safetensors", ".tmp"


class VoiceStoreError(RuntimeError):
    """The store cannot be used (a damaged file, an unreadable directory); the message says which."""


class VoiceExists(Exception):
    pass


@dataclass(frozen=True)
class SavedVoice:
    name: str
    model: str
    created_at: int
    mode: str  # x_vector | in_context
    ref_text: str | None
    num_bytes: int


def model_dir_name(model: str) -> str:
    """A directory name for a model name (which may be a path or a hub id)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", model).strip("._") or "model"


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError("must be 1 to 64 letters, digits, '_' or '-', starting with a letter or digit")
    return name


class VoiceStore:
    def __init__(self, root: Path, voices: dict[tuple[str, str], SavedVoice]) -> None:
        self.root, self._voices = root, voices
        self._lock = threading.Lock()

    @classmethod
    def open(cls, data_dir: str | Path) -> VoiceStore:
        """Check every saved voice under data_dir (created if missing); VoiceStoreError names a bad one."""
        root = Path(data_dir) / "voices"
        try:
            root.mkdir(parents=True, exist_ok=True)
            voices = dict(_scan(root))
        except OSError as exc:
            raise VoiceStoreError(f"voice store {root}: {exc}") from exc
        return cls(root, voices)

    def names(self, model: str) -> list[str]:
        return sorted(name for (m, name) in self._voices if m == model)

    def list(self, model: str) -> list[SavedVoice]:
        return [self._voices[(model, name)] for name in self.names(model)]

    def get(self, model: str, name: str) -> SavedVoice | None:
        return self._voices.get((model, name))

    def prompt(self, model: str, name: str) -> bytes | None:
        """The saved voice's file (its VoicePrompt bytes), re-checked as it is read; None if absent."""
        if (model, name) not in self._voices:
            return None
        path = self._path(model, name)
        try:
            data = path.read_bytes()
            read_voice_file(data)
        except (OSError, VoiceFileError) as exc:
            raise VoiceStoreError(f"saved voice {path} cannot be used: {exc}") from exc
        return data

    def add(self, model: str, name: str, data: bytes) -> SavedVoice:
        """Store a new voice (VoicePrompt bytes); VoiceExists if the name is taken."""
        meta, _ = read_voice_file(data)
        path = self._path(model, name)
        with self._locked(model):
            if (model, name) in self._voices or path.exists():
                raise VoiceExists(name)
            if len(self.names(model)) >= MAX_VOICES_PER_MODEL:
                raise VoiceStoreError(f"model {model} already has {MAX_VOICES_PER_MODEL} saved voices")
            tmp = path.with_name(f".{name}{SUFFIX}{TMP_SUFFIX}")
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            _sync_dir(path.parent)
            voice = _saved(meta, len(data))
            self._voices[(model, name)] = voice
        return voice

    def delete(self, model: str, name: str) -> bool:
        with self._locked(model):
            if self._voices.pop((model, name), None) is None:
                return False
            self._path(model, name).unlink(missing_ok=True)
            _sync_dir(self.root / model_dir_name(model))
        return True

    def _path(self, model: str, name: str) -> Path:
        return self.root / model_dir_name(model) / f"{check_name(name)}{SUFFIX}"

    @contextlib.contextmanager
    def _locked(self, model: str) -> Iterator[None]:
        directory = self.root / model_dir_name(model)
        directory.mkdir(parents=True, exist_ok=True)
        with self._lock, open(directory / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _scan(root: Path) -> Iterator[tuple[tuple[str, str], SavedVoice]]:
    for directory in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in sorted(directory.iterdir()):
            if path.name.endswith(TMP_SUFFIX):
                path.unlink()  # a write that never completed; nothing refers to it
                continue
            if path.name == ".lock" or not path.name.endswith(SUFFIX):
                continue
            yield _load(directory, path)


def _load(directory: Path, path: Path) -> tuple[tuple[str, str], SavedVoice]:
    how = "remove it (or restore it from a backup) and start again"
    if path.stat().st_size > MAX_FILE_BYTES:
        raise VoiceStoreError(f"saved voice {path} is corrupt: larger than {MAX_FILE_BYTES} bytes; {how}")
    data = path.read_bytes()
    try:
        meta, _ = read_voice_file(data)
    except VoiceFileError as exc:
        raise VoiceStoreError(f"saved voice {path} is corrupt: {exc}; {how}") from exc
    name = path.name[: -len(SUFFIX)]
    if meta.get("name") != name or model_dir_name(meta.get("model", "")) != directory.name:
        raise VoiceStoreError(f"saved voice {path} is corrupt: it names voice {meta.get('name')!r} of model "
                              f"{meta.get('model')!r}; {how}")
    try:
        return (meta["model"], name), _saved(meta, len(data))
    except (KeyError, ValueError) as exc:
        raise VoiceStoreError(f"saved voice {path} is corrupt: bad metadata ({exc}); {how}") from exc


def _saved(meta: dict[str, str], num_bytes: int) -> SavedVoice:
    return SavedVoice(name=meta["name"], model=meta["model"], created_at=int(meta.get("created_at", "0")),
                      mode=meta.get("mode", "x_vector"), ref_text=meta.get("ref_text"), num_bytes=num_bytes)


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

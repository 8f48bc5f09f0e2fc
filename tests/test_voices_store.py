"""Saved voices: the file format (voice_prompt.py) and the store on disk (api/voices_store.py), without a
server: atomic writes, names, concurrent writers, and damaged files detected when the store opens."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from safetensors.numpy import load

from vox_serve.api.voices_store import VoiceExists, VoiceStore, VoiceStoreError, check_name
from vox_serve.voice_prompt import VoiceFileError, VoicePrompt, read_voice_file

MODEL = "qwen3-tts-base-tiny"
ICL = VoicePrompt([0.25, -1.5, 3.0], [[1, 2], [3, 4], [5, 6]], "A clip.")


def voice_file(name: str, prompt: VoicePrompt = ICL, model: str = MODEL) -> bytes:
    return prompt.to_bytes(name, model, created_at=1700000000)


def test_prompt_round_trips_and_is_a_safetensors_file() -> None:
    data = voice_file("alice")
    assert VoicePrompt.from_bytes(data) == ICL
    tensors = load(data)  # the real safetensors reader agrees on the layout
    assert tensors["speaker"].tolist() == ICL.speaker and tensors["ref_codes"].tolist() == ICL.ref_codes
    x_vector = VoicePrompt([1.0, 2.0])
    assert VoicePrompt.from_bytes(voice_file("bob", x_vector)) == x_vector and x_vector.mode == "x_vector"


@pytest.mark.parametrize("damage", ["truncate", "flip", "header", "empty"])
def test_damaged_files_are_refused(damage: str) -> None:
    data = bytearray(voice_file("alice"))
    if damage == "truncate":
        data = data[:-3]
    elif damage == "flip":
        data[-1] ^= 0xFF  # tensor bytes no longer match the checksum
    elif damage == "header":
        data[10] = ord("{")
    else:
        data = bytearray()
    with pytest.raises(VoiceFileError):
        read_voice_file(bytes(data))


def test_add_list_delete_and_survive_reopening(tmp_path: Path) -> None:
    store = VoiceStore.open(tmp_path)
    saved = store.add(MODEL, "alice", voice_file("alice"))
    assert saved.mode == "in_context" and saved.ref_text == "A clip." and saved.created_at == 1700000000
    store.add(MODEL, "bob", voice_file("bob", VoicePrompt([1.0])))
    assert store.names(MODEL) == ["alice", "bob"] and store.names("other-model") == []
    assert not list(tmp_path.rglob("*.tmp"))
    reopened = VoiceStore.open(tmp_path)
    assert reopened.names(MODEL) == ["alice", "bob"]
    assert VoicePrompt.from_bytes(reopened.prompt(MODEL, "alice")) == ICL
    assert reopened.delete(MODEL, "alice") and not reopened.delete(MODEL, "alice")
    assert VoiceStore.open(tmp_path).names(MODEL) == ["bob"]


def test_a_name_is_never_overwritten_even_by_concurrent_writers(tmp_path: Path) -> None:
    store = VoiceStore.open(tmp_path)
    results: list[str] = []

    def add(i: int) -> None:
        try:
            store.add(MODEL, "carol", voice_file("carol", VoicePrompt([float(i)])))
            results.append(f"saved {i}")
        except VoiceExists:
            results.append("exists")

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.startswith("saved") for r in results) == 1 and results.count("exists") == 7
    winner = int(next(r for r in results if r.startswith("saved")).split()[1])
    assert VoicePrompt.from_bytes(VoiceStore.open(tmp_path).prompt(MODEL, "carol")).speaker == [float(winner)]


@pytest.mark.parametrize("name", ["", "-x", "a/b", "..", "a b", "x" * 65, "é"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        check_name(name)


def test_a_damaged_store_is_reported_at_open_naming_the_file(tmp_path: Path) -> None:
    store = VoiceStore.open(tmp_path)
    store.add(MODEL, "alice", voice_file("alice"))
    path = next(tmp_path.rglob("alice.safetensors"))
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(VoiceStoreError, match="alice.safetensors is corrupt"):
        VoiceStore.open(tmp_path)


def test_a_file_under_another_name_is_reported(tmp_path: Path) -> None:
    store = VoiceStore.open(tmp_path)
    store.add(MODEL, "alice", voice_file("alice"))
    path = next(tmp_path.rglob("alice.safetensors"))
    path.rename(path.with_name("mallory.safetensors"))
    with pytest.raises(VoiceStoreError, match="names voice 'alice'"):
        VoiceStore.open(tmp_path)


def test_leftovers_of_a_crashed_write_are_removed(tmp_path: Path) -> None:
    VoiceStore.open(tmp_path).add(MODEL, "alice", voice_file("alice"))
    leftover = next(tmp_path.rglob("alice.safetensors")).with_name(".bob.safetensors.tmp")
    leftover.write_bytes(b"half a file")
    assert VoiceStore.open(tmp_path).names(MODEL) == ["alice"] and not leftover.exists()

"""scripts/pack_espeak.sh: the archive a GPU host without espeak-ng is given phonemises as this machine does,
with the library and data taken from the archive (benchmark/gpu_env.sh's environment)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from vox_serve.models.zonos import phonemes

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The 3 quick foxes paid $12 at 5:30."
SNIPPET = ("import sys; from vox_serve.models.zonos import phonemes; "
           "from phonemizer.backend.espeak.wrapper import EspeakWrapper; w = EspeakWrapper(); "
           "print(w.library_path); print(w.data_path); print(phonemes.phonemize(sys.argv[1], 'en-us'))")


def test_packed_espeak_phonemises_like_the_installed_one(tmp_path: Path) -> None:
    why = phonemes.espeak_available()
    if why is not None:
        if os.environ.get("VOX_REQUIRE_ESPEAK") == "1":
            pytest.fail(f"espeak-ng unavailable: {why}")
        pytest.skip(f"espeak-ng unavailable: {why}")
    archive = tmp_path / "espeak.tgz"
    proc = subprocess.run(["bash", "scripts/pack_espeak.sh", "--out", str(archive)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "x", filter="data")
    assert "lib/libespeak-ng.so.1" in names and "espeak-ng-data/en_dict" in names
    assert not any(n.endswith("/de_dict") for n in names)  # only the languages asked for
    packed = tmp_path / "x"
    env = {**os.environ, "PHONEMIZER_ESPEAK_LIBRARY": str(packed / "lib/libespeak-ng.so.1"),
           "ESPEAK_DATA_PATH": str(packed / "espeak-ng-data"), "LD_LIBRARY_PATH": str(packed / "lib")}
    out = subprocess.run([sys.executable, "-c", SNIPPET, TEXT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    library, data, phones = out.stdout.splitlines()
    assert library.startswith(str(packed)) and data.startswith(str(packed))
    assert phones == phonemes.phonemize(TEXT, "en-us") and phones

"""scripts/build_flashinfer_aot.py's host-side parts: the archive it packs (the layout benchmark/gpu_env.sh unpacks
into flashinfer/data/aot/, an older archive's other modules kept, rebuilt ones replaced) and the build environment
of a toolkit without libcuda.so (a stub that exports the driver symbols the modules import)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("build_flashinfer_aot", ROOT / "scripts" / "build_flashinfer_aot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _module(tmp: Path, name: str, payload: bytes) -> Path:
    path = tmp / "build" / name / f"{name}.so"
    path.parent.mkdir(parents=True)
    path.write_bytes(payload)
    return path


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {Path(m.name).as_posix(): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_pack_keeps_the_old_archive_s_other_modules_and_replaces_rebuilt_ones(tmp_path: Path) -> None:
    build = _script()
    old = tmp_path / "old.tgz"
    with tarfile.open(old, "w:gz") as tar:  # written as gpu_env.sh's save_fi_modules does: ./<name>/<name>.so
        for name, payload in (("decode_a", b"old a"), ("prefill_b", b"old b")):
            source = _module(tmp_path / "old", name, payload)
            tar.add(source, arcname=f"./{name}/{name}.so")
    built = [_module(tmp_path, "prefill_b", b"new b"), _module(tmp_path, "xqa_c", b"new c")]
    out = tmp_path / "out.tgz"
    build.pack(built, out, old)
    assert _members(out) == {"decode_a/decode_a.so": b"old a", "prefill_b/prefill_b.so": b"new b",
                             "xqa_c/xqa_c.so": b"new c"}
    build.pack(built, out, None)  # no archive to add to: the built modules alone
    assert set(_members(out)) == {"prefill_b/prefill_b.so", "xqa_c/xqa_c.so"}


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("cc", "nm", "readelf")), reason="no C compiler or binutils")
def test_a_toolkit_without_libcuda_gets_a_stub_exporting_the_driver_symbols(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    build = _script()
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)
    (home / "include" / "cuda.h").write_text("/* the driver API */\n")
    (home / "lib").mkdir()
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.delenv("CPLUS_INCLUDE_PATH", raising=False)
    stub = tmp_path / "stub"
    stub.mkdir()
    env = build.toolkit_env(stub)
    assert env["CPLUS_INCLUDE_PATH"].split(":")[0] == str(home / "include")
    assert env["LIBRARY_PATH"].split(":")[:2] == [str(stub), str(home / "lib")]
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(stub / "libcuda.so")], capture_output=True, text=True,
                             check=True).stdout
    assert all(f" T {name}" in symbols for name in build.DRIVER_SYMBOLS)
    soname = subprocess.run(["readelf", "-d", str(stub / "libcuda.so")], capture_output=True, text=True).stdout
    assert "libcuda.so.1" in soname  # the module then needs the real driver by this name on the GPU host
    (home / "lib" / "libcuda.so").write_bytes(b"")  # a toolkit with the library: no stub
    (stub / "libcuda.so").unlink()
    env = build.toolkit_env(stub)
    assert not (stub / "libcuda.so").exists() and str(stub) not in env["LIBRARY_PATH"].split(":")

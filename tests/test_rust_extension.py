"""The built extension itself: what it links, what it embeds, how it fails without a GPU."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rust_helpers import require_kernels, require_rt

DEFAULT_ARCHS = [80, 86, 89, 90, 100, 120]
FATBIN_MAGIC = 0xBA55ED50


def _library_bytes() -> bytes:
    return Path(require_rt().__file__).read_bytes()


def test_links_no_cuda_runtime() -> None:
    """One CUDA runtime per process (PyTorch's): the extension neither links nor bundles libcudart;
    it reaches CUDA through the driver (libcuda.so.1), opened at run time."""
    data = _library_bytes()
    assert b"libcudart" not in data
    assert b"libcuda.so.1" in data
    assert require_rt().__file__.endswith(".abi3.so")  # one build serves every CPython >= 3.11


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU driver")
def test_cuda_calls_fail_cleanly_without_a_driver() -> None:
    rt = require_rt()
    with pytest.raises(RuntimeError, match=r"libcuda\.so\.1"):
        rt.cuda_driver_version()
    with pytest.raises(RuntimeError, match=r"libcuda\.so\.1"):
        rt.graph_launch(0, 1, 0)
    with pytest.raises(RuntimeError, match=r"libcuda\.so\.1"):
        rt.Event(0)


def _expected_archs() -> list[int]:
    wanted = [int(a) for a in os.environ.get("VOX_CUDA_ARCHS", ",".join(map(str, DEFAULT_ARCHS))).split(",")]
    nvcc = shutil.which("nvcc") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    if not Path(nvcc).exists() and not shutil.which("nvcc"):
        pytest.skip("nvcc is not on this machine: the built architectures cannot be checked against it")
    codes = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, check=True).stdout.split()
    return [a for a in wanted if f"sm_{a}" in codes]


def _fatbin_entries(fatbin: bytes) -> list[tuple[str, int]]:
    """(kind, SM version) of each image in a CUDA fatbin: a 16-byte header (magic, version, header
    size, payload size), then entries whose headers give kind (1 PTX, 2 ELF), their own header and
    padded payload sizes, and the SM version at byte 28."""
    magic, _, header, size = struct.unpack_from("<IHHQ", fatbin, 0)
    assert magic == FATBIN_MAGIC
    entries, offset = [], header
    while offset < header + size:
        kind, _, entry_header, padded = struct.unpack_from("<HHIQ", fatbin, offset)
        entries.append(({1: "ptx", 2: "elf"}[kind], struct.unpack_from("<I", fatbin, offset + 28)[0]))
        offset += entry_header + padded
    return entries


def test_embeds_the_kernels_for_the_requested_architectures() -> None:
    """The fatbin holds code for VOX_CUDA_ARCHS (default 80..120) limited to what nvcc supports, plus
    PTX of the newest one, so a newer GPU can still compile them."""
    rt = require_kernels()
    archs = _expected_archs()
    assert rt.kernel_archs() == archs
    fatbin = rt.kernel_fatbin()
    assert sorted(_fatbin_entries(fatbin)) == sorted([("elf", a) for a in archs] + [("ptx", max(archs))])
    assert b"vox_sample" in fatbin and b"vox_hash_uniform" in fatbin


def test_kernels_stay_off_on_cpu_tensors() -> None:
    """Without CUDA tensors the dispatch never reaches the extension (the reference kernels run)."""
    require_rt()
    from vox_serve.rt import rust_ops

    assert not rust_ops.enabled(torch.zeros(2))


def test_imports_in_a_fresh_interpreter_without_torch() -> None:
    """The extension stands alone: importing it loads no torch and no CUDA library."""
    rt = require_rt()
    root = Path(rt.__file__).parents[1]
    code = ("import sys; from vox_serve import _rt; "
            "print(int('torch' in sys.modules), _rt.planner_available(), _rt.kernels_embedded())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "0"

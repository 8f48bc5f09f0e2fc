"""Build the FlashInfer modules vox-serve's bf16 head-dim-128 models run, ahead of time, and pack them as the
archive `benchmark/gpu_env.sh` unpacks into `flashinfer/data/aot/` (`<name>/<name>.so` each; docs/offline-install.md).

    python scripts/build_flashinfer_aot.py [--arch 9.0a] [--modules decode,prefill_fa2,prefill_fa3,xqa]
        [--groups 2,3] [--out .fiaot.tgz] [--add-to .fiaot.tgz]

It runs on a host with nvcc and no GPU (e.g. the CPU development machine): where the toolkit lacks the driver
API's header path for the host compiler, it is added (CPLUS_INCLUDE_PATH), and where there is no libcuda.so to
link against (XQA links it), a stub defining the symbols the module imports stands in; the module then loads the
real driver on the GPU host. The modules:

- decode: FlashInfer's CUDA-core batch decode (Qwen3-TTS's talker at 4+ rows);
- prefill_fa2: its fa2 batch prefill, which also serves tensor-core decode (Orpheus-3B);
- prefill_fa3: its SM90 prefill (every prefill on Hopper; 27 minutes on 2 cores);
- xqa: its XQA decode per GQA group (--groups; only benchmark/decode_attention.py runs it).

Measured on 2 cores: prefill_fa2 50 s, xqa under 20 s a group.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

DTYPE = torch.bfloat16
HEAD_DIM, PAGE = 128, 16
# The driver-API symbols FlashInfer's modules import from libcuda (XQA's tensor maps).
DRIVER_SYMBOLS = ("cuGetErrorName", "cuTensorMapEncodeTiled")


def specs(modules: list[str], groups: list[int]) -> list:
    """FlashInfer's JIT specs of the named modules."""
    from flashinfer.jit.attention import gen_batch_decode_module, gen_batch_prefill_module
    from flashinfer.jit.xqa import gen_xqa_module

    makers: dict[str, Callable[[], list]] = {
        "decode": lambda: [gen_batch_decode_module(DTYPE, DTYPE, DTYPE, torch.int32, HEAD_DIM, HEAD_DIM, 0, False,
                                                   False)],
        "prefill_fa2": lambda: [gen_batch_prefill_module("fa2", DTYPE, DTYPE, DTYPE, torch.int32, HEAD_DIM, HEAD_DIM,
                                                         0, False, False, False)],
        "prefill_fa3": lambda: [gen_batch_prefill_module("fa3", DTYPE, DTYPE, DTYPE, torch.int32, HEAD_DIM, HEAD_DIM,
                                                         0, False, False, False)],
        "xqa": lambda: [gen_xqa_module(DTYPE, DTYPE, PAGE, HEAD_DIM, g, False, DTYPE, 1) for g in groups],
    }
    unknown = sorted(set(modules) - set(makers))
    if unknown:
        raise SystemExit(f"unknown modules {unknown}: choose from {sorted(makers)}")
    return [spec for name in modules for spec in makers[name]()]


def toolkit_env(stub_dir: Path) -> dict[str, str]:
    """The environment a CPU host's build needs: the toolkit's include path for the host compiler and, where no
    libcuda.so is found, a stub of it."""
    env = dict(os.environ)
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    include = home / "include"
    if (include / "cuda.h").is_file():
        env["CPLUS_INCLUDE_PATH"] = os.pathsep.join(filter(None, [str(include), env.get("CPLUS_INCLUDE_PATH")]))
    libs = [p for p in (home / "lib", home / "lib64", home / "lib64" / "stubs") if p.is_dir()]
    if not any((p / "libcuda.so").exists() for p in libs):
        source = stub_dir / "stub.c"
        source.write_text("".join(f"int {name}(void) {{ return 0; }}\n" for name in DRIVER_SYMBOLS))
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(stub_dir / "libcuda.so"), "-Wl,-soname,libcuda.so.1",
                        str(source)], check=True)
        libs.insert(0, stub_dir)
    env["LIBRARY_PATH"] = os.pathsep.join(filter(None, [*map(str, libs), env.get("LIBRARY_PATH")]))
    return env


def pack(built: list[Path], out: Path, add_to: Path | None) -> None:
    """Write `out` with each module as <name>/<name>.so, after the members of `add_to` not rebuilt."""
    names = {path.stem for path in built}
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "out.tgz"
        with tarfile.open(staged, "w:gz") as archive:
            if add_to is not None and add_to.is_file():
                with tarfile.open(add_to) as old:
                    for member in old.getmembers():
                        if member.isfile() and Path(member.name).parts[-2] not in names:
                            archive.addfile(member, old.extractfile(member))
            for path in built:
                archive.add(path, arcname=f"{path.stem}/{path.name}")
        staged.replace(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="9.0a", help="FLASHINFER_CUDA_ARCH_LIST (9.0a: H100/H200)")
    parser.add_argument("--modules", default="decode,prefill_fa2")
    parser.add_argument("--groups", default="2,3", help="XQA's query heads per KV head")
    parser.add_argument("--out", type=Path, default=Path(".fiaot.tgz"))
    parser.add_argument("--add-to", type=Path, help="an archive whose other modules the new one keeps")
    parser.add_argument("--workspace", type=Path, help="FLASHINFER_WORKSPACE_BASE for the build (a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FLASHINFER_CUDA_ARCH_LIST"] = args.arch
        os.environ["FLASHINFER_WORKSPACE_BASE"] = str(args.workspace or Path(tmp) / "ws")
        os.environ.update(toolkit_env(Path(tmp)))
        built = []
        for spec in specs(args.modules.split(","), [int(g) for g in args.groups.split(",")]):
            print(f"building {spec.name}", flush=True)
            spec.build(verbose=False)
            built.append(Path(spec.jit_library_path))
        pack(built, args.out, args.add_to)
    print(f"{len(built)} modules -> {args.out}")


if __name__ == "__main__":
    main()

"""Build FlashInfer's attention modules ahead of time, on a machine without a GPU, and pack them as `.fiaot.tgz`
(`<name>/<name>.so` each), which benchmark/gpu_env.sh unpacks into the GPU host's `flashinfer/data/aot/` so no
device call spends minutes compiling them.

    python scripts/flashinfer_aot.py [--arch 9.0a] [--head-dim 128] [--merge ../shared/gpu/flashinfer-...tgz]
        [--out .fiaot.tgz]

Builds, for bfloat16 queries, int32 indices and no in-kernel position encoding, window or logits cap, the modules
the engine's FlashInfer backend loads for each KV cache dtype (bfloat16, float8 e4m3):
- the CUDA-core batch decode (GQA groups below 3: Qwen3-TTS' talker);
- the fa2 batch prefill, which the tensor-core decode (Orpheus) runs for both caches, and the prefill for a
  float8 cache (fa3 reads float8 only with float8 queries).
Not built: the fa3 prefill of a bfloat16 cache (27 minutes on 2 cores); `--merge` adds the modules of an existing
archive, e.g. the shared one that has it. Needs flashinfer-python (the version the GPU host runs), torch, nvcc and
a C++ compiler; on a host without libcuda.so the link step finds an empty stub this script writes. Measured on 2
cores with nvcc 13.0: about 15 s per decode module and 1 minute per prefill module.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path


def stub_libcuda(directory: Path) -> None:
    """An empty libcuda.so to satisfy FlashInfer's `-lcuda` where no driver is installed (the modules call no
    driver function, and `--as-needed` drops the dependency)."""
    src = directory / "stub.c"
    src.write_text("void vox_serve_libcuda_stub(void) {}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(directory / "libcuda.so"), str(src)], check=True)


def build(head_dim: int) -> list[Path]:
    import torch
    from flashinfer.jit.attention import gen_batch_decode_module, gen_batch_prefill_module

    q, idx = torch.bfloat16, torch.int32
    libraries = []
    for kv in (torch.bfloat16, torch.float8_e4m3fn):
        specs = [gen_batch_decode_module(q, kv, q, idx, head_dim, head_dim, 0, False, False),
                 gen_batch_prefill_module("fa2", q, kv, q, idx, head_dim, head_dim, 0, False, False, False)]
        for spec in specs:
            print(f"building {spec.name}", flush=True)
            spec.build(verbose=False)
            libraries.append(Path(spec.jit_library_path))
    return libraries


def pack(libraries: list[Path], merge: Path | None, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if merge is not None:
            with tarfile.open(merge) as archive:
                archive.extractall(root, filter="data")
        for library in libraries:
            target = root / library.stem / library.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(library.read_bytes())
        modules = sorted(p for p in root.iterdir() if p.is_dir())
        with tarfile.open(out, "w:gz") as archive:
            for module in modules:
                archive.add(module, arcname=f"./{module.name}")
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB, {len(modules)} modules")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="9.0a", help="FLASHINFER_CUDA_ARCH_LIST (9.0a: H100/H200)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--merge", type=Path, help="an existing module archive whose modules are kept")
    parser.add_argument("--out", type=Path, default=Path(".fiaot.tgz"))
    args = parser.parse_args()
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = args.arch
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 2))
    stub = Path(tempfile.mkdtemp(prefix="cudastub"))
    stub_libcuda(stub)
    os.environ["FLASHINFER_EXTRA_LDFLAGS"] = f"{os.environ.get('FLASHINFER_EXTRA_LDFLAGS', '')} -L{stub}".strip()
    if "flashinfer" in sys.modules:
        raise SystemExit("import flashinfer after the environment is set")
    pack(build(args.head_dim), args.merge, args.out)


if __name__ == "__main__":
    main()

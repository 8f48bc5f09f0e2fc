#!/usr/bin/env bash
# Build a wheelhouse for installing vox-serve on a GPU host without network access.
# Run on a connected machine (any OS with pip), then copy the folder to the GPU host.
#
#   scripts/build_wheelhouse.sh [--python 3.12] [--platform manylinux_2_28_x86_64] [--with-torch] [--out wheelhouse]
#
# torch is left out by default: GPU hosts usually carry a CUDA build already. See docs/offline-install.md.
set -euo pipefail
PY=3.12; PLATFORM=manylinux_2_28_x86_64; OUT=wheelhouse; WITH_TORCH=0; FLASHINFER=flashinfer-python==0.6.4
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY=$2; shift 2;;
    --platform) PLATFORM=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    --with-torch) WITH_TORCH=1; shift;;
    --flashinfer) FLASHINFER=$2; shift 2;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
pip wheel --no-deps --wheel-dir "$OUT" .
# Binary wheels for the target interpreter and platform; manylinux tags are matched exactly by pip,
# so list the older ones the packages are published under too.
TAGS=(--platform "$PLATFORM" --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
PKGS=(numpy safetensors tokenizers fastapi annotated-doc opentelemetry-api starlette pydantic pydantic-core annotated-types typing-inspection
      typing-extensions anyio idna sniffio h11 click uvicorn python-multipart pyzmq msgpack
      av prometheus-client websockets httpx httpcore certifi
      "$FLASHINFER" apache-tvm-ffi nvidia-cudnn-frontend einops ninja tqdm requests tabulate packaging nvidia-ml-py
      soundfile cffi pycparser  # tests/engine_helpers.py (the GPU tier writes WAVs)
      phonemizer attrs dlinfo joblib inflect jaraco.functools more-itertools typeguard)  # the last line: Zonos text
[ "$WITH_TORCH" = 1 ] && PKGS+=(torch)
for pkg in "${PKGS[@]}"; do
  pip download --no-deps --only-binary=:all: --python-version "$PY" --implementation cp "${TAGS[@]}" \
    --dest "$OUT" "$pkg"
done
echo "wheelhouse ready in $OUT ($(ls "$OUT" | wc -l) wheels)"

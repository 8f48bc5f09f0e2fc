#!/usr/bin/env bash
# The wheels the GPU session scripts carry in .whl/ (benchmark/gpu_env.sh installs them on the device machine,
# ahead of its own packages): what its image lacks, for its Python 3.12 on x86-64. ~16 MB, a minute.
#   bash benchmark/gpu_wheels.sh            # into .whl/ (git ignores it)
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any)
args=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d "${DEST:-.whl}")
for p in "${platforms[@]}"; do args+=(--platform "$p"); done
python3 -m pip download -q "${args[@]}" flashinfer-python==0.6.4 apache-tvm-ffi pyzmq soundfile cffi pycparser \
  fastapi starlette pydantic pydantic-core uvicorn annotated-types typing-inspection
ls "${DEST:-.whl}"

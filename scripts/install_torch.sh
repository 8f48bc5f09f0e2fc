#!/usr/bin/env bash
# Install torch into the environment of the interpreter $1 (default: python), unless that version is
# there already. On a machine without an NVIDIA GPU this is PyTorch's CPU build, from PyTorch's own CPU
# index (about 200 MB; PyPI's default Linux wheel is the CUDA build, several GB):
#     python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
# Where that index cannot be reached, pip's own configuration decides (a local CPU wheel, say).
set -euo pipefail
PY=${1:-python}
TORCH_VERSION=${VOX_TORCH_VERSION:-2.13.0}
CPU_INDEX=${VOX_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
have=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
if [ "$have" = "$TORCH_VERSION" ]; then
  echo "torch $TORCH_VERSION already installed for $PY"
  exit 0
fi
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  "$PY" -m pip install "torch==$TORCH_VERSION"            # a GPU: PyPI's CUDA build
elif ! "$PY" -m pip install --retries 1 --timeout 15 "torch==$TORCH_VERSION" --index-url "$CPU_INDEX"; then
  echo "install_torch: $CPU_INDEX is not reachable; installing torch==$TORCH_VERSION as pip is configured" >&2
  "$PY" -m pip install "torch==$TORCH_VERSION"
fi

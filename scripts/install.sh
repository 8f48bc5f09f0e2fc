#!/usr/bin/env bash
# The one install command (README "Quick start"; CI runs it on a clean clone): system packages, the
# Rust extension's build dependencies, torch (the CPU build on a machine without an NVIDIA GPU; see
# install_torch.sh), vox-serve editable with its test extra (which compiles vox_serve._rt), and the
# Qwen3-TTS reference environment (.venv-qwen) that the equivalence tests run in a subprocess.
# Idempotent; add other install steps here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_system_deps.sh
bash scripts/install_rust_build_deps.sh
bash scripts/install_torch.sh python
python -m pip install -e ".[test]"
bash scripts/setup_qwen_reference.sh

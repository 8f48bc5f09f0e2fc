#!/usr/bin/env bash
# The one install command (README "Quick start"; CI runs it on a clean clone): system packages, the
# Rust extension's build dependencies, the package with its test extras (which compiles
# vox_serve._rt), and the Qwen3-TTS reference environment for the equivalence tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_system_deps.sh
bash scripts/install_rust_build_deps.sh
pip install torch==2.13.0 -e ".[test]"
bash scripts/setup_qwen_reference.sh

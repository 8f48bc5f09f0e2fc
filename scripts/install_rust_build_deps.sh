#!/usr/bin/env bash
# Build dependencies of the optional Rust extension vox_serve._rt (rust/), for `pip install -e .`
# to compile it. Idempotent; safe to run before every install.
#
# - The Rust crates come from Debian's packages (no crate registry is reachable from our
#   machines): .cargo/config.toml points cargo at /usr/share/cargo/registry, where they unpack.
#   Installed as root with apt-get; otherwise a warning says what is missing.
# - cargo: kept if one is on PATH, else Debian's (Rust 1.63, which the crate supports).
# - flashinfer-python's headers (for the compiled attention planner) only where nvcc exists: the
#   planner is built by nvcc. The package is installed without its dependencies here (only its
#   headers are used at build time); GPU hosts install it with them (docs/offline-install.md).
#
# Without these the install still succeeds: the extension is skipped (no cargo) or built without
# its CUDA parts (no nvcc / no headers), with a warning, and vox-serve serves with Python.
set -euo pipefail
FLASHINFER=${FLASHINFER:-flashinfer-python==0.6.4}  # the version scripts/build_wheelhouse.sh ships
PACKAGES=(librust-pyo3-dev librust-libloading-dev librust-serde-json-dev librust-cc-dev
          librust-hyper-dev librust-tokio-dev librust-crossbeam-channel-dev)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
command -v cargo >/dev/null 2>&1 || missing+=(cargo)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "warning: the Rust extension needs ${missing[*]} (apt-get install as root); it will not be built" >&2
  fi
fi
NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
if [ -x "$NVCC" ] || command -v nvcc >/dev/null 2>&1; then
  python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('flashinfer') is None)" 2>/dev/null \
    || python -m pip install -q --no-deps "$FLASHINFER"
fi
echo "Rust extension build dependencies: cargo $(cargo --version 2>/dev/null | cut -d' ' -f2 || echo missing)"

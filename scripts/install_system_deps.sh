#!/usr/bin/env bash
# System packages vox-serve needs beyond Python: espeak-ng (Zonos phonemises text through it, via the
# `phonemizer` package). Idempotent: does nothing when the library is already installed (~15 s otherwise).
set -euo pipefail

if ldconfig -p 2>/dev/null | grep -q libespeak-ng; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install espeak-ng with your system's package manager (Zonos phonemisation needs libespeak-ng)" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq espeak-ng >/dev/null

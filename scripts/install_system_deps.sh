#!/usr/bin/env bash
# System packages beyond Python, from Debian's packages (apt-get as root; else a message says what to
# install). Idempotent: installs only what is missing.
#   espeak-ng   Zonos phonemises text through it (the `phonemizer` package); needed to serve Zonos
#   ffmpeg      the tests check encoded audio with ffprobe/ffmpeg, independently of the PyAV encoders
#   chromium    the tests drive the playground page in headless Chromium
set -euo pipefail
need=()
ldconfig -p 2>/dev/null | grep -q libespeak-ng || need+=(espeak-ng)
command -v ffprobe >/dev/null 2>&1 || need+=(ffmpeg)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null; then
    echo "install ${need[*]} with your system's package manager" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

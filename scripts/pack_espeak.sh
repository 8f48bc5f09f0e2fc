#!/usr/bin/env bash
# Pack this machine's espeak-ng (the library, the shared libraries it needs that a bare host may lack,
# and its data for the languages given) as one archive for a GPU host without espeak-ng and without
# network (Zonos phonemises text with it). benchmark/gpu_env.sh unpacks `.espeak.tgz` when it is carried.
#   scripts/pack_espeak.sh [--langs en] [--out .espeak.tgz]      (needs espeak-ng installed here)
set -euo pipefail
LANGS=en; OUT=.espeak.tgz
while [ $# -gt 0 ]; do
  case "$1" in
    --langs) LANGS=$2; shift 2;;
    --out) OUT=$2; shift 2;;
    *) echo "unknown option $1" >&2; exit 2;;
  esac
done
LIB=$(ldconfig -p | awk '/libespeak-ng.so.1 / {print $NF; exit}')
[ -n "$LIB" ] || { echo "libespeak-ng.so.1 not found: apt-get install espeak-ng" >&2; exit 1; }
DATA=$(dirname "$(readlink -f "$LIB")")/espeak-ng-data
STAGE=$(mktemp -d); mkdir -p "$STAGE/lib" "$STAGE/espeak-ng-data"
cp -L "$LIB" "$STAGE/lib/"
# every dependency except the C/C++ runtime the host has anyway
ldd "$LIB" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' \
  | while read -r dep; do cp -L "$dep" "$STAGE/lib/"; done
# the data: everything but the other languages' dictionaries
for f in "$DATA"/*; do
  case "$(basename "$f")" in
    *_dict) ;;
    *) cp -r "$f" "$STAGE/espeak-ng-data/";;
  esac
done
for lang in ${LANGS//,/ }; do cp "$DATA/${lang}_dict" "$STAGE/espeak-ng-data/"; done
tar czf "$OUT" -C "$STAGE" lib espeak-ng-data
rm -rf "$STAGE"
ls -la "$OUT"

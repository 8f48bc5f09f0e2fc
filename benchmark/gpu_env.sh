# Sourced by the GPU session scripts: $OUT, and the wheels carried in .whl/ installed off-line
# (see docs/offline-install.md) ahead of the machine's own packages.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -n "${VOX_SITE:-}" ] && [ -d "$VOX_SITE" ]; then  # sourced again (a script calling another): installed once
  export PYTHONPATH=$VOX_SITE:$PWD
elif ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export VOX_SITE=/tmp/site PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
export VOX_GIT_COMMIT=${VOX_GIT_COMMIT:-}  # the commit the results record (the copied tree may carry a stale .git)
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
# FlashInfer modules compiled by an earlier call (save_fi_modules below), carried as .fiaot/: loaded
# as ahead-of-time modules instead of compiling them again (minutes of device time).
if [ -f .fiaot.tgz ] && [ -d /tmp/site/flashinfer ]; then
  mkdir -p /tmp/site/flashinfer/data/aot && tar xzf .fiaot.tgz -C /tmp/site/flashinfer/data/aot
fi
# espeak-ng for Zonos' text prompts on a host without it (scripts/pack_espeak.sh), carried as .espeak.tgz.
# Only the libraries the host lacks stay on LD_LIBRARY_PATH: its own (newer) ones must win for everything else.
if [ -f .espeak.tgz ]; then
  mkdir -p /tmp/espeak && tar xzf .espeak.tgz -C /tmp/espeak
  for lib in /tmp/espeak/lib/*.so*; do
    name=$(basename "$lib")
    [ "$name" != libespeak-ng.so.1 ] && ldconfig -p | awk '{print $1}' | grep -qxF "$name" && rm -f "$lib"
  done
  export LD_LIBRARY_PATH=/tmp/espeak/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PHONEMIZER_ESPEAK_LIBRARY=/tmp/espeak/lib/libespeak-ng.so.1 ESPEAK_DATA_PATH=/tmp/espeak/espeak-ng-data
fi
left() { echo $((LIMIT - SECONDS)); }  # seconds left of the calling script's LIMIT
capped() { local cap=$1; echo $(( $(left) < cap ? $(left) : cap )); }  # a part's timeout: cap, or what is left
extend_table() {  # MODULE MEASURED OUT: a sweep's table (MEASURED) written as OUT over this GPU's packaged table
  # of vox_serve.rt.MODULE (small_gemm or fp8_gemm; "extends", read by small_gemm.read_layered), where there is one
  python3 - "$@" <<'PY'
import importlib, json, sys
import torch
from vox_serve.rt import small_gemm
module, measured = importlib.import_module(f"vox_serve.rt.{sys.argv[1]}"), json.load(open(sys.argv[2]))
base = small_gemm.table_path(torch.cuda.get_device_name(), module.TABLES_DIR)
extends = {"extends": base.name} if base.is_file() else {}
json.dump({**measured, **extends}, open(sys.argv[3], "w"), indent=1)
print(f"{len(measured['entries'])} entries measured, on top of {base.name if extends else 'no packaged table'}")
PY
}
save_fi_modules() {  # pack the modules this call compiled as $OUT/fiaot.tgz (<name>/<name>.so each)
  local dir=/tmp/fiaot; rm -rf "$dir"; mkdir -p "$dir"
  find "$FLASHINFER_WORKSPACE_BASE" -path '*cached_ops*' -name '*.so' 2>/dev/null | while read -r so; do
    name=$(basename "$so" .so); mkdir -p "$dir/$name" && cp "$so" "$dir/$name/"
  done
  [ -n "$(ls "$dir")" ] && tar czf "$OUT/fiaot.tgz" -C "$dir" . && ls -la "$OUT/fiaot.tgz"
}
pack_out() {  # many files do not come back from the device machine: pack directories into one archive
  (cd "$OUT" && tar czf runs.tgz --remove-files "$@" 2>/dev/null; ls -la runs.tgz)
}
start_server() {  # LOG PORT CMD...: start the server in the background (SERVER_PID), wait for /health
  local log=$1 port=$2; shift 2
  "$@" > "$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "server exited:"; tail -5 "$log"; return 1; }
    sleep 1
  done
  echo "server not ready after 240 s"; return 1
}

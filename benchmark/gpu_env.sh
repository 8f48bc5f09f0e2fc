# Sourced by the GPU session scripts: $OUT, and the wheels carried in .whl/ installed off-line
# (see docs/offline-install.md) ahead of the machine's own packages.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
export VOX_GIT_COMMIT=${VOX_GIT_COMMIT:-unknown}  # the tree copied to a GPU machine has no .git: pass it in
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
# FlashInfer modules compiled by an earlier call (save_fi_modules below), carried as .fiaot/: loaded
# as ahead-of-time modules instead of compiling them again (minutes of device time).
if [ -d .fiaot ] && [ -d /tmp/site/flashinfer ]; then
  mkdir -p /tmp/site/flashinfer/data/aot && cp -r .fiaot/* /tmp/site/flashinfer/data/aot/
fi
save_fi_modules() {  # copy the modules this call compiled to $OUT/fiaot/<name>/<name>.so
  find "$FLASHINFER_WORKSPACE_BASE" -path '*cached_ops*' -name '*.so' 2>/dev/null | while read -r so; do
    name=$(basename "$so" .so); mkdir -p "$OUT/fiaot/$name" && cp "$so" "$OUT/fiaot/$name/"
  done
  du -sh "$OUT/fiaot" 2>/dev/null
}

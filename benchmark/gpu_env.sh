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

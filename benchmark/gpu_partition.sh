#!/usr/bin/env bash
# One device call for `--codec-sms` (rt/partition.py): what this torch's green contexts offer, the GPU tier
# of SM partitions (tests/test_gpu_partition.py), then bench mode in the Rust runtime on one GPU with the
# codec half on a partition of each size in SMS against the whole engine (benchmark/gpu_runtimes.sh parts).
# Usage (repo root): SMS="16 32 64" MODELS=orpheus PARTS=single bash benchmark/gpu_partition.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
python3 - <<'PY' 2>&1 | tee "$OUT/green_api.txt"
import inspect, torch
from torch.cuda import green_contexts as g
print("torch", torch.__version__, "cuda", torch.version.cuda, "supported", getattr(g, "SUPPORTED", None))
print("GreenContext:", [n for n in dir(g.GreenContext) if not n.startswith("__")])
print("create:", inspect.signature(g.GreenContext.create))
PY
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_partition.py \
    ${EXTRA_TESTS:-} 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt"
fi
for sms in ${SMS:-}; do
  if [ "$sms" = 0 ]; then TAG=whole RS_EXTRA= RUNTIMES=rust bash benchmark/gpu_runtimes.sh
  else TAG=sms$sms RS_EXTRA="--codec-gpu 0 --codec-sms $sms" RUNTIMES=rust bash benchmark/gpu_runtimes.sh; fi
done
true

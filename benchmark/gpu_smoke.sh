#!/usr/bin/env bash
# One device-machine call: install carried wheels, run the GPU test tier, then bench-mode figures for
# Orpheus-3B with dummy weights. Writes logs under $OUT. Usage (repo root): bash benchmark/gpu_smoke.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, flashinfer; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__)" 2>&1 | tail -2
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_sampling_kernels.py \
  tests/test_attention_torch.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
B=(python3 -m vox_serve.launch --model orpheus --load-format dummy --device cuda --max-model-len 1152
   --bench-kwargs '{"max_tokens": 1024, "ignore_eos": true}')
for n in ${BENCH_SIZES:-1 64 256}; do
  echo "== bench-requests $n"
  timeout "${BENCH_TIMEOUT:-120}" "${B[@]}" --bench-requests "$n" --max-batch-size "$((n < 8 ? 8 : n))" \
    --max-codec-batch "$((n < 8 ? 8 : n))" ${BENCH_EXTRA:-} > "$OUT/bench_$n.txt" 2> "$OUT/bench_$n.err"
  echo "rc=$?"; grep -E "weights|ready" "$OUT/bench_$n.err" | tail -2; head -3 "$OUT/bench_$n.txt"; tail -1 "$OUT/bench_$n.txt"
  tail -3 "$OUT/bench_$n.err" | grep -i error
done
if [ -d "$FLASHINFER_WORKSPACE_BASE/.cache" ]; then
  (cd "$FLASHINFER_WORKSPACE_BASE" && tar czf "$OUT/fi_cache.tgz" --exclude='*.o' --exclude='*.cu' .cache) && ls -la "$OUT/fi_cache.tgz"
fi

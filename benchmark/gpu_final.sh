#!/usr/bin/env bash
# One device call for a results set: the GPU test tier, bench-mode single requests, then the HTTP
# load benchmark for Orpheus-3B and Qwen3-TTS-1.7B (dummy weights).
# Usage (repo root): VOX_GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmark/gpu_final.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_gpu_kernels.py \
  -k "${TEST_FILTER:-not orpheus_3b and not dtype1}" 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
bench1() {  # model max_tokens extra...: one request in bench mode (no HTTP), TTFA and RTF
  local model=$1 tokens=$2; shift 2
  timeout 120 python3 -m vox_serve.launch --model "$model" --load-format dummy --device cuda --max-model-len 1152 \
    --max-batch-size 8 --max-codec-batch 8 --bench-requests 1 --async-scheduling \
    --bench-kwargs "{\"max_tokens\": $tokens, \"ignore_eos\": true}" "$@" > "$OUT/bench1_$model.txt" 2>&1
  echo "bench 1 x $model $*: $(grep -E '^bench-000' "$OUT/bench1_$model.txt")"
}
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  bench1 orpheus 1024
  bench1 qwen3-tts 128 ${QWEN_EXTRA:-}
fi
[ "${SKIP_ORPHEUS:-0}" != 1 ] && echo "== orpheus" && MODEL=orpheus MAX_TOKENS=1024 RATES=${ORPHEUS_RATES:-8,12,16} NUM_REQUESTS=${ORPHEUS_N:-120} OFFLINE=256 \
  SERVER_EXTRA="--async-scheduling ${ORPHEUS_EXTRA:-}" bash benchmark/gpu_load.sh
echo "== qwen3-tts"
MODEL=qwen3-tts MAX_TOKENS=128 RATES=${QWEN_RATES:-10,20,40} NUM_REQUESTS=${QWEN_N:-160} OFFLINE=256 PORT=8001 \
  SERVER_EXTRA="--async-scheduling ${QWEN_EXTRA:-}" bash benchmark/gpu_load.sh
# At most a few files come back from the device machine: the JSON results travel as one archive.
(cd "$OUT" && tar czf results.tgz ./*.json ./*.log ./*.txt 2>/dev/null && ls -la results.tgz)

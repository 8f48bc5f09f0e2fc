#!/usr/bin/env bash
# One device call: per-stage times and top kernels (benchmark/profile_stages.py) for Orpheus-3B and
# Qwen3-TTS-1.7B with dummy weights. Usage (repo root): bash benchmark/gpu_stages.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
for model in ${MODELS:-orpheus qwen3-tts}; do
  echo "===== $model"
  timeout "${STAGE_TIMEOUT:-240}" python3 benchmark/profile_stages.py --model "$model" --load-format dummy --device cuda \
    --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256 --out "$OUT/stages_$model" 2>&1 \
    | grep -vE "USDT|profiler_st" | tee "$OUT/stages_$model.txt" | cut -c1-160
done
save_fi_modules

#!/usr/bin/env bash
# The models of issue 13 (CSM-1B, Zonos) and the Rust runtime on one H200, dummy weights, results under $OUT:
#   PART=tests  the GPU tests of CSM, Zonos, paired rows, Qwen3 codec priming and the Rust runtime on CUDA
#   PART=bench  bench-mode single requests (TTFA, RTF) and 64 at once, per model and runtime
# Usage (repo root): VOX_GIT_COMMIT=$(git rev-parse --short HEAD) PART=tests bash benchmark/gpu_models.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${PART:-tests}" = tests ] || [ "${PART:-}" = both ]; then
  VOX_REQUIRE_RT=1 timeout "${TEST_TIMEOUT:-480}" python3 -m pytest -q -p no:cacheprovider -m gpu --durations=0 \
    ${TESTS:-tests/test_zonos_gpu.py tests/test_paired_rows.py tests/test_csm_gpu.py tests/test_rust_runtime.py \
    tests/test_gpu.py} -k "${TEST_FILTER:-csm or codec_priming or zonos or paired or rust}" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
  [ "${PART:-tests}" = tests ] && exit 0
fi
bench() {  # runtime model n max_tokens extra...: bench mode (no HTTP), per-request TTFA and RTF
  local runtime=$1 model=$2 n=$3 tokens=$4; shift 4
  local log="$OUT/bench${n}_${runtime}_$model.txt"
  timeout "${BENCH_TIMEOUT:-150}" python3 -m vox_serve.launch --runtime "$runtime" --model "$model" --load-format dummy \
    --device cuda --max-model-len "${MAX_MODEL_LEN:-1280}" --max-batch-size "${MAX_BATCH:-64}" --bench-requests "$n" \
    --bench-kwargs "{\"max_tokens\": $tokens, \"ignore_eos\": true}" "$@" > "$log" 2>&1
  echo "$runtime $model x$n: rc=$? $(grep -E '^bench-000' "$log" | cut -c1-200) | $(grep -iE 'rtf|audio-s' "$log" | tail -1 | cut -c1-200)"
}
for runtime in ${RUNTIMES:-python rust}; do
  for spec in ${MODELS:-"orpheus:1176" "qwen3-tts:128" "csm:125" "zonos:430"}; do
    model=${spec%%:*} tokens=${spec##*:} extra=()
    [ "$model" = qwen3-tts ] && extra=(--first-chunk-frames 2 --detokenize-interval 5)
    [ "$runtime" = rust ] && [ "$model" = zonos ] && continue  # refused by the Rust runtime (paired rows)
    bench "$runtime" "$model" 1 "$tokens" "${extra[@]}"
    [ "${SKIP_BATCH:-0}" = 1 ] || bench "$runtime" "$model" 64 "$tokens" "${extra[@]}"
  done
done
(cd "$OUT" && tar czf results.tgz ./*.log ./*.txt 2>/dev/null && ls -la results.tgz)

#!/usr/bin/env bash
# Engine v2 on one H200, in device calls of under 10 minutes each (results under $OUT):
#   PART=tests  the GPU test tier, the host-cost benchmark (null engine) and bench-mode single requests
#   PART=load   the load benchmark of one tree (TREE=. for this one, TREE=.before for the tree before Engine v2,
#               a `git archive` of 988400d carried as .before/): Orpheus-3B 14.08 s requests (1176 tokens) at
#               Poisson 4, 6, 8, 12/s and 256 at once (TRACE=1 adds a --trace-dir run at 8/s); Qwen3-TTS-1.7B
#               128-frame requests at 10, 20, 40/s and 256 at once.
# Usage (repo root): VOX_GIT_COMMIT=$(git rev-parse --short HEAD) PART=tests bash benchmark/gpu_engine2.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmark/gpu_env.sh
ROOT=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${PART:-tests}" = tests ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_gpu_kernels.py \
    tests/test_attention_torch.py ${TEST_EXTRA:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
  timeout 180 python3 benchmark/host_cost.py --steps 300 --out "$OUT/host_cost.json" 2>&1 | tee "$OUT/host_cost.txt"
  for spec in "orpheus 1176" "qwen3-tts 128 --first-chunk-frames 2 --detokenize-interval 5"; do
    set -- $spec; model=$1 tokens=$2; shift 2
    timeout 150 python3 -m vox_serve.launch --model "$model" --load-format dummy --device cuda --max-model-len 1280 \
      --max-batch-size 8 --max-codec-batch 8 --bench-requests 1 --async-scheduling \
      --bench-kwargs "{\"max_tokens\": $tokens, \"ignore_eos\": true}" "$@" > "$OUT/bench1_$model.txt" 2>&1
    echo "bench 1 x $model: $(grep -E '^bench-000' "$OUT/bench1_$model.txt")"; grep -E "^model .* on cuda" "$OUT/bench1_$model.txt" | cut -c1-400
  done
  (cd "$OUT" && tar czf results.tgz ./*.json ./*.log ./*.txt 2>/dev/null)
  exit 0
fi
TREE=${TREE:-.}; TAG=$( [ "$TREE" = . ] && echo after || echo before )
cd "$TREE" || exit 1
export PYTHONPATH=/tmp/site:$PWD
if [ "${SKIP_ORPHEUS:-0}" != 1 ]; then
  echo "== orpheus ($TAG)"
  NAME=${TAG}_orpheus MODEL=orpheus MAX_TOKENS=1176 MAX_MODEL_LEN=1280 RATES=${ORPHEUS_RATES:-4,6,8,12} \
    NUM_REQUESTS=${ORPHEUS_N:-96} OFFLINE=256 SERVER_EXTRA="--async-scheduling" bash "$ROOT/benchmark/gpu_load.sh"
  if [ "${TRACE:-0}" = 1 ]; then
    NAME=${TAG}_orpheus_trace MODEL=orpheus MAX_TOKENS=1176 MAX_MODEL_LEN=1280 RATES=8 NUM_REQUESTS=64 OFFLINE=0 \
      SERVER_EXTRA="--async-scheduling --trace-dir /tmp/trace" bash "$ROOT/benchmark/gpu_load.sh"
    python3 "$ROOT/benchmark/trace_summary.py" /tmp/trace --json "$OUT/${TAG}_orpheus_trace_summary.json"
  fi
fi
echo "== qwen3-tts ($TAG)"
NAME=${TAG}_qwen3-tts MODEL=qwen3-tts MAX_TOKENS=128 MAX_MODEL_LEN=1280 RATES=${QWEN_RATES:-10,20,40} \
  NUM_REQUESTS=${QWEN_N:-160} OFFLINE=256 PORT=8001 \
  SERVER_EXTRA="--async-scheduling --first-chunk-frames 2 --detokenize-interval 5" bash "$ROOT/benchmark/gpu_load.sh"
(cd "$OUT" && tar czf "results_$TAG.tgz" ./*.json ./*.log ./*.txt 2>/dev/null && ls -la "results_$TAG.tgz")

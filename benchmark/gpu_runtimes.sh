#!/usr/bin/env bash
# Issue 12's measure in bench mode (no HTTP): the Python and Rust runtimes side by side, dummy weights,
# on the benchmark/results workloads. Per runtime and model, one process per part (one engine each):
#   single   --bench-requests 1
#   rates    --bench-requests N at each --bench-rate (Poisson phases on one engine, one after another)
#   offline  256 at once
# Orpheus: 1176 tokens (14.08 s of audio) ignore_eos, --max-model-len 1280, rates 4,6,8,12 with N=96.
# Qwen3-TTS: 128 frames, --first-chunk-frames 2 --detokenize-interval 5, rates 10,20,40 with N=160.
# Each process runs under `timeout` and writes $OUT/<model>_<part>_<runtime>.json (--bench-json) and .log;
# everything is packed into $OUT/runtimes.tgz at the end (few files come back from the device machine).
#
# Select what one device call (< 10 min) runs with RUNTIMES, MODELS and PARTS, e.g.
#   VOX_GIT_COMMIT=$(git rev-parse --short HEAD) MODELS=orpheus PARTS="single rates" bash benchmark/gpu_runtimes.sh
#   VOX_GIT_COMMIT=... MODELS=orpheus PARTS=offline bash benchmark/gpu_runtimes.sh
#   VOX_GIT_COMMIT=... MODELS=qwen3-tts bash benchmark/gpu_runtimes.sh
# Estimates, not measured (each process also loads the model, ~30 s, and captures its graphs): Orpheus
# rates ~2.5 min per runtime (arrivals span 24+16+12+8 s, each request then runs ~15 s), offline ~1 min;
# Qwen3-TTS rates ~1 min per runtime. Other knobs: ORPHEUS_RATES, ORPHEUS_N, QWEN_RATES, QWEN_N, OFFLINE_N,
# DURATION (s: each rate phase sends rate x DURATION requests instead of N, a steady load at every rate),
# MAX_BATCH (decode and codec batch, 256), PY_EXTRA (Python runtime flags, default --async-scheduling, as
# the HTTP results were served), RS_EXTRA (Rust runtime flags, e.g. --dp-size 2), TAG (appended to every output
# name), TIMEOUT (s per process, 280: two fit in one call; the JSON is rewritten after every phase, so a process
# stopped by it keeps the phases it finished).
# Dry run on CPU with the tiny models (seconds): DEVICE=cpu MODEL_SUFFIX=-tiny ORPHEUS_TOKENS=42 QWEN_FRAMES=24
#   ORPHEUS_N=3 QWEN_N=3 OFFLINE_N=4 ORPHEUS_RATES=20,40 QWEN_RATES=20 MAX_BATCH=8 PY_EXTRA= bash benchmark/gpu_runtimes.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmark/gpu_env.sh
DEVICE=${DEVICE:-cuda}
MODEL_SUFFIX=${MODEL_SUFFIX:-}
MAX_BATCH=${MAX_BATCH:-256}
PY_EXTRA=${PY_EXTRA---async-scheduling}
# The HTTP load benchmark's text (benchmark/load.py TEXT), so prompts are as long as in its results.
BENCH_TEXT=${BENCH_TEXT:-$(python3 -c 'import ast, sys
tree = ast.parse(open("benchmark/load.py").read())
print(next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "TEXT"))')}
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

bench() {  # runtime model part requests rates extra...: one bench-mode process; prints its summaries
  local runtime=$1 model=$2 part=$3 n=$4 rates=$5; shift 5
  local name="${model}_${part}_${runtime}${TAG:+_$TAG}" args=()
  [ -n "$rates" ] && args+=(--bench-rate "$rates")
  # shellcheck disable=SC2206  # PY_EXTRA / RS_EXTRA are lists of flags
  [ "$runtime" = python ] && args+=($PY_EXTRA)
  # shellcheck disable=SC2206
  [ "$runtime" = rust ] && args+=(${RS_EXTRA:-})
  timeout "${TIMEOUT:-280}" python3 -m vox_serve.launch --runtime "$runtime" --model "$model$MODEL_SUFFIX" \
    --load-format dummy --device "$DEVICE" --max-batch-size "$MAX_BATCH" --max-codec-batch "$MAX_BATCH" \
    --bench-requests "$n" --bench-text "$BENCH_TEXT" --bench-json "$OUT/$name.json" "${args[@]}" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc"
  grep -E '^(phase|summary)' "$OUT/$name.log" | cut -c1-200
  [ "$rc" = 0 ] || grep -iE 'error|Traceback' "$OUT/$name.log" | head -3
}

model_args() {  # model: the workload's flags
  case $1 in
    orpheus) echo "--max-model-len ${ORPHEUS_MAX_MODEL_LEN:-1280}" \
      "--bench-kwargs {\"max_tokens\":${ORPHEUS_TOKENS:-1176},\"ignore_eos\":true}" ;;
    qwen3-tts) echo "--max-model-len ${QWEN_MAX_MODEL_LEN:-1152} --first-chunk-frames 2 --detokenize-interval 5" \
      "--bench-kwargs {\"max_tokens\":${QWEN_FRAMES:-128},\"ignore_eos\":true}" ;;
    *) echo "unknown model $1" >&2; return 1 ;;
  esac
}

for model in ${MODELS:-orpheus qwen3-tts}; do
  read -r -a margs <<< "$(model_args "$model")" || exit 1
  if [ "$model" = orpheus ]; then rates=${ORPHEUS_RATES:-4,6,8,12} n=${ORPHEUS_N:-96}
  else rates=${QWEN_RATES:-10,20,40} n=${QWEN_N:-160}; fi
  for runtime in ${RUNTIMES:-python rust}; do
    for part in ${PARTS:-single rates offline}; do
      case $part in
        single) bench "$runtime" "$model" single 1 "" "${margs[@]}" ;;
        rates) bench "$runtime" "$model" rates "$n" "$rates" "${margs[@]}" ${DURATION:+--bench-duration "$DURATION"} ;;
        offline) bench "$runtime" "$model" offline "${OFFLINE_N:-256}" "" "${margs[@]}" ;;
        *) echo "unknown part $part (single, rates, offline)"; exit 1 ;;
      esac
    done
  done
done
(cd "$OUT" && tar czf runtimes.tgz ./*.json ./*.log ./*.txt 2>/dev/null; ls -la runtimes.tgz)

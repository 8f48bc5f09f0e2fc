#!/usr/bin/env bash
# Where a lone request's TTFA goes in the Rust runtime's bench mode, step by step (issue 15: Orpheus 67.5 ms on
# an H200 against ~28 decode steps of ~2.1 ms). One bench process per model with --trace-dir, then, from the
# trace, the first STEPS steps: wall ms since the first step, what was planned, and each stage's device ms; and
# benchmark/trace_summary.py's totals. Results under $OUT (trace_<model>[_TAG].txt, bench_<model>[_TAG].log); ~45 s a
# model. VOX_EARLY_PCM=0 TAG=late: the same with each step's PCM handed over with its LM rows (the A/B of
# rust/src/driver/worker.rs `early_pcm`).
# Usage (repo root, carrying what gpu_issue15.sh carries):
#   VOX_GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmark/gpu_ttfa_trace.sh
# Dry run on CPU: DEVICE=cpu MODEL_SUFFIX=-tiny TOKENS=42 FRAMES=12 bash benchmark/gpu_ttfa_trace.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmark/gpu_env.sh
DEVICE=${DEVICE:-cuda}; MODEL_SUFFIX=${MODEL_SUFFIX:-}; STEPS=${STEPS:-34}
BENCH_TEXT=$(python3 -c 'import ast
tree = ast.parse(open("benchmark/load.py").read())
print(next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "TEXT"))')
for model in ${MODELS:-orpheus qwen3-tts}; do
  if [ "$model" = orpheus ]; then
    args=(--max-model-len 1280 --bench-kwargs "{\"max_tokens\":${TOKENS:-1176},\"ignore_eos\":true}")
  else
    args=(--max-model-len 1152 --first-chunk-frames 2 --detokenize-interval 5
          --bench-kwargs "{\"max_tokens\":${FRAMES:-128},\"ignore_eos\":true}")
  fi
  name=$model${TAG:+_$TAG}; dir=$OUT/trace_$name; rm -rf "$dir"
  timeout "${TIMEOUT:-150}" python3 -m vox_serve.launch --runtime rust --model "$model$MODEL_SUFFIX" --load-format dummy \
    --device "$DEVICE" --max-batch-size 256 --max-codec-batch 256 --bench-requests 1 --bench-text "$BENCH_TEXT" \
    --trace-dir "$dir" "${args[@]}" ${RS_EXTRA:-} > "$OUT/bench_$name.log" 2>&1
  echo "$name: rc=$? $(grep -E '^summary' "$OUT/bench_$name.log" | cut -c1-200)"
  python3 - "$dir" "$STEPS" > "$OUT/trace_$name.txt" <<'PY'
import sys
from collections import defaultdict
from vox_serve.trace import read_trace
records = [r for path in sorted(__import__("pathlib").Path(sys.argv[1]).glob("*.jsonl")) for r in read_trace(path)]
stages = defaultdict(list)
for r in records:
    if r["type"] == "stage":
        stages[r["step"]].append(f'{r["stage"]}:{r["rows"]}r/{r["device_ms"]:.3f}')
steps = [r for r in records if r["type"] == "schedule"]
t0 = steps[0]["t"] if steps else 0.0
for r in steps[: int(sys.argv[2])]:
    planned = f'prefill={len(r["prefill"])} decode={len(r["decode"])} codec={len(r["codec"])}'
    print(f'step {r["step"]:4d} t={1000 * (r["t"] - t0):8.2f} ms plan={r.get("plan_ms", 0):.3f} {planned} '
          + " ".join(stages.get(r["step"], [])))
PY
  python3 benchmark/trace_summary.py "$dir" >> "$OUT/trace_$name.txt" 2>&1
  head -"$STEPS" "$OUT/trace_$name.txt" | cut -c1-220; tail -12 "$OUT/trace_$name.txt"
done

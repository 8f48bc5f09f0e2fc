#!/usr/bin/env bash
# One device call: where a step's time goes. GPU tests of the attention path, then bench mode of
# Orpheus-3B (dummy weights) with 1 and N requests, synchronous and --async-scheduling, each with
# --trace-dir (summarised by trace_summary.py: device vs wall time per step), and one cProfile run
# of the host. Writes everything under $OUT. Usage (repo root): bash benchmark/gpu_profile.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
N=${N:-256}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
[ "${TESTS:-1}" = 1 ] && timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "not orpheus_3b" 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -4
[ "${STAGES:-0}" = 1 ] && timeout 300 python3 benchmark/profile_stages.py --model orpheus --load-format dummy --device cuda \
  --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256 2>&1 | grep -vE "USDT|profiler_st|warn" | cut -c1-140 > "$OUT/stages.txt"
grep -E "graph .* eager|device total" "$OUT/stages.txt" 2>/dev/null
save_fi_modules
B=(python3 -m vox_serve.launch --model orpheus --load-format dummy --device cuda --max-model-len 1152)
bench() {  # name requests max_tokens extra...
  local name=$1 n=$2 tokens=$3; shift 3
  local max=$((n < 8 ? 8 : n))
  timeout "${BENCH_TIMEOUT:-150}" "${B[@]}" --bench-requests "$n" --max-batch-size "$max" --max-codec-batch "$max" \
    --bench-kwargs "{\"max_tokens\": $tokens, \"ignore_eos\": true}" --trace-dir "$OUT/trace_$name" "$@" \
    > "$OUT/bench_$name.txt" 2> "$OUT/bench_$name.err"
  echo "== $name (rc $?): $(awk 'NR>1 && $2+0>0 {s+=$2; n++} END {if (n) printf "TTFA mean %.1f ms", s/n}' "$OUT/bench_$name.txt"); $(tail -1 "$OUT/bench_$name.txt")"
  grep -iE "error|Traceback" "$OUT/bench_$name.err" | tail -3
  python3 benchmark/trace_summary.py "$OUT/trace_$name" --json "$OUT/summary_$name.json"
}
RUNS=${RUNS:-single_sync single_async n_sync n_async profile}
for run in $RUNS; do
  case $run in
    single_sync) bench single_sync 1 1024 ;;
    single_async) bench single_async 1 1024 --async-scheduling ;;
    n_sync) bench "n${N}_sync" "$N" 512 ;;
    n_async) bench "n${N}_async" "$N" 512 --async-scheduling ;;
  esac
done
case " $RUNS " in *" profile "*) ;; *) exit 0 ;; esac
timeout 150 python3 -m cProfile -o "$OUT/host_n${N}_async.prof" -m vox_serve.launch --model orpheus --load-format dummy \
  --device cuda --max-model-len 1152 --bench-requests "$N" --max-batch-size "$N" --max-codec-batch "$N" --async-scheduling \
  --bench-kwargs '{"max_tokens": 256, "ignore_eos": true}' > /dev/null 2>&1
python3 -c "import pstats; pstats.Stats('$OUT/host_n${N}_async.prof').sort_stats('tottime').print_stats(35)" \
  > "$OUT/host_n${N}_async.txt" 2>&1; grep -A40 "ncalls" "$OUT/host_n${N}_async.txt" | cut -c1-150 | head -40

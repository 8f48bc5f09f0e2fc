# Call 1 (repo root on the device): this GPU's float8 tables measured, then the step, a lone request and the
# offline workload with them. Usage: VOX_GIT_COMMIT=<tree> LIMIT=570 bash benchmark/results/h100-2026-12-08/call1.sh
set -u
LIMIT=${LIMIT:-570}
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
W8="--kv-cache-dtype fp8 --quantization fp8"
# 1. rt/small_gemm's float8 entries at 1 row (the one-row layout of a8ab5bb); their winners on top of the table
LIMIT=$(capped 150) SWEEP_ROWS=${SWEEP_ROWS:-1} SWEEP_MODELS=${SWEEP_MODELS:-orpheus} PARTS=sweep \
  bash benchmark/gpu_fp8_weights.sh 2>&1 | grep -E "m= 1|entries|rror" | cut -c1-170
[ -f "$OUT/small_gemm_fp8_table.json" ] && export VOX_SMALL_GEMM_TABLE=$OUT/small_gemm_fp8_table.json
# 2. the Triton float8 GEMM's entries at 64-256 rows
LIMIT=$(capped 150) SWEEP_MODELS=orpheus PARTS=sweep bash benchmark/gpu_fp8_gemm.sh 2>&1 \
  | grep -E -e "cuBLASLt|entries|rror" | cut -c1-170
[ -f "$OUT/fp8_gemm_table.json" ] && export VOX_FP8_GEMM_TABLE=$OUT/fp8_gemm_table.json
# 3. the captured step (both tables), a lone request, the offline workload; then the offline workload without them
STAGES=decode BATCHES=1,16,64,256 TOP=6 timeout "$(capped 110)" python3 benchmark/profile_stages.py --model orpheus \
  --load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256 $W8 \
  > "$OUT/decode_orpheus_kv8w8.txt" 2>&1
echo "profile rc=$?"; grep -E -A3 "^decode x" "$OUT/decode_orpheus_kv8w8.txt" | grep -v -E "arn" | cut -c1-150
RS_EXTRA="--quantization fp8" TAG=w8 MODELS=orpheus TIMEOUT=$(capped 80) bash benchmark/gpu_ttfa_trace.sh 2>&1 \
  | grep -E "rc=|^step +(1|2|28|29) |^steps|rror"
for tag in tables base; do
  [ "$(left)" -gt 55 ] || { echo "offline $tag: skipped, $(left)s left"; continue; }
  [ $tag = base ] && unset VOX_SMALL_GEMM_TABLE VOX_FP8_GEMM_TABLE
  RS_EXTRA="$W8" TAG=kv8w8_$tag TIMEOUT=$(capped 100) MODELS=orpheus PARTS=offline RUNTIMES=rust \
    bash benchmark/gpu_runtimes.sh 2>&1 | grep -E "rc=|^summary|rror"
done
echo "done in ${SECONDS}s"

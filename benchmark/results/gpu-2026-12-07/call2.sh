set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json VOX_GIT_COMMIT=$1
LIMIT=${2:-450}
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
A="--load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256"
for m in orpheus qwen3-tts; do  # the captured decode step per batch size (graph ms) and its kernels
  STAGES=decode BATCHES=1,16,64,256 TOP=14 timeout 100 python3 benchmark/profile_stages.py --model $m $A > $OUT/decode_$m.txt 2>&1
  echo "$m decode rc=$?"; grep "decode x" $OUT/decode_$m.txt | sed 's/eager_ms.*//'
done
# A/B: Orpheus' gate/up at 1 row as rt/small_gemm's norm_gated kernel (the norm and the gate folded in)
VOX_SMALL_GEMM_TABLE=benchmark/results/gpu-2026-12-07/table_gated.json STAGES=decode BATCHES=1 TOP=14 timeout 80 \
  python3 benchmark/profile_stages.py --model orpheus $A > $OUT/decode_orpheus_gated.txt 2>&1
echo "orpheus gated rc=$?"; grep "decode x" $OUT/decode_orpheus_gated.txt | sed 's/eager_ms.*//'
left=$((LIMIT - SECONDS)); echo "single requests with ${left}s left"
TIMEOUT=75 MODELS="orpheus qwen3-tts" PARTS=single TESTS=0 timeout "$left" bash benchmark/gpu_overlap.sh
left=$((LIMIT + 100 - SECONDS)); echo "traced single Orpheus request with ${left}s left"  # where its TTFA goes
[ "$left" -gt 50 ] && TIMEOUT=$((left - 5)) MODELS=orpheus PARTS=single RUNTIMES=rust TAG=trace \
  RS_EXTRA="--trace-dir $OUT/trace" bash benchmark/gpu_runtimes.sh | grep -E "rc=|^summary" \
  && python3 benchmark/trace_summary.py "$OUT/trace" | tee "$OUT/trace_single.txt"
rm -rf "$OUT/trace"; cd "$OUT" && rm -f ./*.json ./*.log; ls

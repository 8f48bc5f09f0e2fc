set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json VOX_GIT_COMMIT=$1
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
TIMEOUT=100 MODELS="orpheus qwen3-tts" PARTS=offline SMS_AB=32 TESTS=0 timeout 450 bash benchmark/gpu_overlap.sh
left=$((500 - SECONDS)); echo "tests with ${left}s left"
[ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -q -x -m gpu tests/test_overlap_detok.py > "$OUT/tests.txt" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.txt"
left=$((585 - SECONDS)); echo "trace with ${left}s left"  # where the whole engine's step goes at 256 rows
[ "$left" -gt 60 ] && TIMEOUT=$((left - 10)) MODELS=orpheus PARTS=offline RUNTIMES=rust TAG=trace \
  RS_EXTRA="--trace-dir $OUT/trace" bash benchmark/gpu_runtimes.sh | grep -E "rc=|^summary" \
  && python3 benchmark/trace_summary.py "$OUT/trace" | tee "$OUT/trace_summary.txt"
rm -rf "$OUT/trace"; cd "$OUT" && rm -f ./*.json ./*.log; ls

set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json VOX_GIT_COMMIT=$1
LIMIT=${2:-300}
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
TIMEOUT=90 MODELS=orpheus PARTS=offline TESTS=0 timeout $((LIMIT - 90)) bash benchmark/gpu_overlap.sh
left=$((LIMIT - 50 - SECONDS)); echo "test with ${left}s left"
[ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -q -x -m gpu tests/test_overlap_detok.py \
  -k "on_a_gpu and orpheus and async" > "$OUT/tests.txt" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.txt"
left=$((LIMIT - SECONDS)); echo "qwen3-tts with ${left}s left"
for mode in whole async; do  # gpu_overlap.sh's runs of the whole engine and --async-engines
  left=$((LIMIT - SECONDS)); [ "$left" -gt 40 ] || break
  flag=$([ $mode = async ] && echo --async-engines)
  RS_EXTRA=$flag TAG=$mode TIMEOUT=$left MODELS=qwen3-tts PARTS=offline RUNTIMES=rust bash benchmark/gpu_runtimes.sh \
    2>&1 | grep -E "rc=|^summary"
done
cd "$OUT" && rm -f ./*.json ./*.log; ls

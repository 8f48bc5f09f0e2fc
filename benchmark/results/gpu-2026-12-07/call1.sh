set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json VOX_GIT_COMMIT=$1
LIMIT=${2:-380}
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
TIMEOUT=90 MODELS=orpheus PARTS=offline TESTS=0 timeout $((LIMIT - 60)) bash benchmark/gpu_overlap.sh
left=$((LIMIT - 60 - SECONDS)); echo "qwen3-tts with ${left}s left"
[ "$left" -gt 60 ] && TIMEOUT=80 MODELS=qwen3-tts PARTS=offline TESTS=0 timeout "$left" bash benchmark/gpu_overlap.sh
left=$((LIMIT - SECONDS)); echo "tests with ${left}s left"
[ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -q -x -m gpu tests/test_overlap_detok.py > "$OUT/tests.txt" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.txt"
cd "$OUT" && rm -f ./*.json ./*.log; ls

set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json VOX_GIT_COMMIT=$1
LIMIT=${2:-200}
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
orpheus() {  # tag flags...: gpu_overlap.sh's run of Orpheus' offline workload in one mode
  local tag=$1; shift
  RS_EXTRA="$*" TAG=$tag TIMEOUT=80 MODELS=orpheus PARTS=offline RUNTIMES=rust bash benchmark/gpu_runtimes.sh \
    2>&1 | grep -E "rc=|^summary"
}
orpheus whole
orpheus async --async-engines
left=$((LIMIT - SECONDS)); echo "test with ${left}s left"
[ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -q -x -m gpu tests/test_overlap_detok.py \
  -k "on_a_gpu and orpheus and async" > "$OUT/tests.txt" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.txt"
left=$((LIMIT - SECONDS)); [ "$left" -gt 60 ] && orpheus overlap --overlap-detok
cd "$OUT" && rm -f ./*.json ./*.log; ls

#!/usr/bin/env bash
# rt/fp8_gemm's Triton float8 GEMM against cuBLASLt's per rows bucket (--quantization fp8), in one device call on one
# GPU (results under $OUT). Parts, in the order named in PARTS (default "sweep profile offline tests offline_base"):
#   sweep    each decoder projection of Orpheus and Qwen3-TTS (talker, code predictor) at SWEEP_ROWS (64,128,256)
#            rows, the Triton GEMM's candidates against cuBLASLt (benchmark/fp8_gemm.py); the winners become
#            VOX_FP8_GEMM_TABLE for the parts after it, over the packaged table's other entries
#            ($OUT/fp8_gemm_table.json; extending it: fp8_gemm_table_extending.json);
#   profile  the captured decode step of each of PROFILE_MODELS (orpheus) at BATCHES (64,256) rows of 512 tokens
#            (float8 weights and KV cache), cuBLASLt only (VOX_FP8_GEMM=0) and with the table
#            (benchmark/profile_stages.py; TOP kernels each);
#   offline  Orpheus' offline workload (256 at once, Rust runtime, float8 weights and KV cache) with the table;
#   offline_base  the same with cuBLASLt only (VOX_FP8_GEMM=0): the baseline on the same machine;
#   tests    the GPU tier's checks of the Triton GEMM, the float8 projections and the float8-cache decode attention.
# Each part runs while time is left of LIMIT seconds (default 560). Usage (repo root, carrying .whl from
# benchmark/gpu_wheels.sh, vox_serve/_rt.abi3.so from `pip install -e .`, and .fiaot.tgz):
#   VOX_GIT_COMMIT=$(git rev-parse --short HEAD) LIMIT=560 bash benchmark/gpu_fp8_gemm.sh
set -u
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-560}
PARTS=${PARTS:-sweep profile offline tests offline_base}
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
W8="--kv-cache-dtype fp8 --quantization fp8"
profile() {  # tag: the captured decode step per batch of each of PROFILE_MODELS, while 70 s are left
  local tag=$1 model
  for model in ${PROFILE_MODELS:-orpheus}; do
    [ "$(left)" -gt 70 ] || { echo "profile $model $tag: skipped, $(left)s left"; continue; }
    STAGES=decode BATCHES=${BATCHES:-64,256} TOP=${TOP:-8} timeout "$(capped 120)" python3 benchmark/profile_stages.py \
      --model "$model" --load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 \
      --max-codec-batch 256 $W8 > "$OUT/decode_${model}_$tag.txt" 2>&1
    echo "profile $model $tag rc=$?"
    grep -E -A4 "^decode x" "$OUT/decode_${model}_$tag.txt" | grep -v -E "Warn|warn" | cut -c1-160
  done
}
offline() {  # tag: Orpheus' offline workload (Rust runtime), while 60 s are left
  [ "$(left)" -gt 60 ] || { echo "offline $1: skipped, $(left)s left"; return; }
  RS_EXTRA="$W8" TAG=$1 TIMEOUT=$(capped 110) MODELS=orpheus PARTS=offline RUNTIMES=rust \
    bash benchmark/gpu_runtimes.sh 2>&1 | grep -E "rc=|^summary|rror"
}
for part in $PARTS; do
  case $part in
    sweep)
      timeout "$(capped 220)" python3 benchmark/fp8_gemm.py --rows "${SWEEP_ROWS:-64,128,256}" \
        --models "${SWEEP_MODELS:-orpheus,qwen3}" --out "$OUT/fp8_gemm.json" --table "$OUT/fp8_gemm_table.json" 2>&1 \
        | tee "$OUT/fp8_gemm.txt" | cut -c1-200
      extend_table fp8_gemm "$OUT/fp8_gemm_table.json" "$OUT/fp8_gemm_table_extending.json" \
        && export VOX_FP8_GEMM_TABLE=$OUT/fp8_gemm_table_extending.json
      ;;
    profile)
      VOX_FP8_GEMM=0 profile cublas
      profile table
      ;;
    offline)
      offline kv8w8_table
      ;;
    offline_base)
      VOX_FP8_GEMM=0 offline kv8w8_cublas
      ;;
    tests)
      [ "$(left)" -gt 40 ] || { echo "tests: skipped, $(left)s left"; continue; }
      timeout "$(capped 150)" python3 -m pytest -q -m gpu tests/test_gpu_kernels.py tests/test_decode_attention.py \
        tests/test_triton_attention.py -k "float8 or quantize or decode or fp8" > "$OUT/tests.txt" 2>&1
      echo "tests rc=$?"; tail -5 "$OUT/tests.txt"
      ;;
    *) echo "unknown part $part" ;;
  esac
done

#!/usr/bin/env bash
# Float8 decoder weights (--quantization fp8: rt/fp8_gemm, layers/fp8) against the model's bfloat16 weights, in one
# device call on one GPU (results under $OUT). Parts, in the order named in PARTS (default "tests profile ttfa"):
#   sweep    rt/small_gemm's kernels over float8 weights at 1-16 rows against the float8 GEMM, Orpheus' shapes
#            (benchmark/small_gemm.py --weights fp8); the entries that won, on top of this GPU's packaged table,
#            become VOX_SMALL_GEMM_TABLE for the parts after it ($OUT/small_gemm_fp8_table.json);
#   tests    the GPU tier's float8-weight checks: the small-rows kernels with scales and the rows' quantization
#            against the CPU references, the float8 GEMM at 1-256 rows, a decoder stack on both paths against its
#            dequantized weights, full-size Orpheus and Qwen3-TTS graphs equal to their eager steps, and the Rust
#            runtime's WAVs equal to the Python runtime's;
#   profile  Orpheus' captured decode step at BATCHES (1,16,64,256) rows of 512 tokens, both weights
#            (benchmark/profile_stages.py; TOP kernels each);
#   ttfa     a lone Orpheus request's steps and TTFA (benchmark/gpu_ttfa_trace.sh), both weights;
#   offline  Orpheus' offline workload (256 at once, Rust runtime) with a float8 KV cache, both weights, and
#            float8 weights at OFFLINE_WIDE (512) at once with --max-batch-size OFFLINE_WIDE;
#   qwen     the Qwen3-TTS frame's captured step at 1 and 16 rows and its offline workload, both weights.
# Each part runs while time is left of LIMIT seconds (default 560). Usage (repo root, carrying .whl from
# benchmark/gpu_wheels.sh, vox_serve/_rt.abi3.so from `pip install -e .`, and .fiaot.tgz):
#   VOX_GIT_COMMIT=$(git rev-parse --short HEAD) LIMIT=560 PARTS="tests profile ttfa" bash benchmark/gpu_fp8_weights.sh
set -u
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-560}
PARTS=${PARTS:-tests profile ttfa}
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
offline() {  # model tag flags...: one offline run of the Rust runtime, while at least 60 s are left
  local model=$1 tag=$2; shift 2
  [ "$(left)" -gt 60 ] || { echo "$model $tag: skipped, $(left)s left"; return; }
  RS_EXTRA="$*" TAG=$tag TIMEOUT=$(capped 110) MODELS=$model PARTS=offline RUNTIMES=rust \
    bash benchmark/gpu_runtimes.sh 2>&1 | grep -E "rc=|^summary|rror"
}
profile() {  # model batches tag flags...: the captured decode step per batch, while 70 s are left
  local model=$1 batches=$2 tag=$3; shift 3
  [ "$(left)" -gt 70 ] || { echo "profile $model $tag: skipped, $(left)s left"; return; }
  STAGES=decode BATCHES=$batches TOP=${TOP:-8} timeout "$(capped 130)" python3 benchmark/profile_stages.py \
    --model "$model" --load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 \
    --max-codec-batch 256 "$@" > "$OUT/decode_${model}_$tag.txt" 2>&1
  echo "profile $model $tag rc=$?"; grep -E "^decode x|^model" "$OUT/decode_${model}_$tag.txt" | cut -c1-220
}
for part in $PARTS; do
  case $part in
    sweep)
      timeout "$(capped 240)" python3 benchmark/small_gemm.py --weights fp8 --models "${SWEEP_MODELS:-orpheus}" \
        --rows "${SWEEP_ROWS:-1,2,4,8,16}" --compile-jobs 14 --out "$OUT/small_gemm_fp8.json" --table "$OUT/sg_fp8.json" 2>&1 \
        | grep -v "^begin" | tee "$OUT/small_gemm_fp8.txt" | cut -c1-200
      extend_table small_gemm "$OUT/sg_fp8.json" "$OUT/small_gemm_fp8_table.json" \
        && export VOX_SMALL_GEMM_TABLE=$OUT/small_gemm_fp8_table.json
      ;;
    tests)
      timeout "$(capped 200)" python3 -m pytest -q -m gpu tests/test_gpu_kernels.py tests/test_gpu.py \
        tests/test_rust_runtime.py -k "float8 or rows_quantize or w8" > "$OUT/tests.txt" 2>&1
      echo "tests rc=$?: $(tail -1 "$OUT/tests.txt" 2>/dev/null)"
      grep -E "^(FAILED|ERROR)|Error" "$OUT/tests.txt" | head -8 ;;
    profile)
      profile orpheus "${BATCHES:-1,16,64,256}" bf16
      profile orpheus "${BATCHES:-1,16,64,256}" w8 --quantization fp8 ;;
    ttfa)
      for tag in bf16 w8; do
        [ "$(left)" -gt 60 ] || { echo "ttfa $tag: skipped, $(left)s left"; continue; }
        extra=""; [ $tag = w8 ] && extra="--quantization fp8"
        RS_EXTRA="$extra" TAG=$tag MODELS=orpheus TIMEOUT=$(capped 90) bash benchmark/gpu_ttfa_trace.sh 2>&1 \
          | grep -E "rc=|^step +(1|2|28|29) |^steps|rror"
      done ;;
    offline)
      offline orpheus kv8 --kv-cache-dtype fp8
      offline orpheus kv8w8 --kv-cache-dtype fp8 --quantization fp8
      wide=${OFFLINE_WIDE:-512}
      MAX_BATCH=$wide OFFLINE_N=$wide offline orpheus "kv8w8_$wide" --kv-cache-dtype fp8 --quantization fp8 ;;
    qwen)
      profile qwen3-tts 1,16 bf16
      profile qwen3-tts 1,16 w8 --quantization fp8
      offline qwen3-tts bf16
      offline qwen3-tts w8 --quantization fp8 ;;
    *) echo "unknown part $part (tests, profile, ttfa, offline, qwen)"; exit 1 ;;
  esac
done
echo "done in ${SECONDS}s"

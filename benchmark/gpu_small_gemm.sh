#!/usr/bin/env bash
# One device call: rt.small_gemm measured against the unfused ops on this GPU (its table written to
# $OUT/small_gemm_table.json), the GPU tier of the kernels with that table (rt.small_gemm, rt.slot_head, the
# Rust sampler), then (KERNEL_BENCH=1) the sampler's and the slot head's launch times, (ATTENTION_BENCH=1) the
# decode-attention candidate's GPU tests and its times against FlashInfer (ATTENTION_ARGS), then (PROFILE=1, and
# DEPTH_AB=1 for Qwen3-TTS with VOX_DEPTH_ATTENTION=1 as well, PDL_AB=1 with VOX_PDL=0,
# ORPHEUS_AB=1 with VOX_ORPHEUS_STEP_KERNELS=1, STEP_AB=1 with VOX_DEPTH_STEP=1,
# FI_DECODE_AB=1 with VOX_TRITON_DECODE=0, ROWS_AB=1 with VOX_LAUNCH_ROWS=0, TRITON_ROWS_AB=1 with
# VOX_TRITON_DECODE=all VOX_TRITON_DECODE_ROWS=${TRITON_ROWS:-256}) the
# decode stages of Orpheus-3B and Qwen3-TTS-1.7B with the table and, from TREE_BEFORE (default .before), without.
# Usage (repo root): bash benchmark/gpu_small_gemm.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi -L
if [ -z "${VOX_SMALL_GEMM_TABLE:-}" ]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmark/small_gemm.py --out "$OUT/small_gemm_results.json" \
    --table "$OUT/small_gemm_table.json" --compile-jobs "${COMPILE_JOBS:-12}" ${SMALL_GEMM_ARGS:-} 2>&1 \
    | tee "$OUT/small_gemm.txt" | cut -c1-200
  export VOX_SMALL_GEMM_TABLE=$OUT/small_gemm_table.json
fi
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_kernels.py \
    tests/test_gpu_rust.py tests/test_slot_head.py -k "${TEST_FILTER:-not planner and not prefill}" 2>&1 | tail -25 | tee "$OUT/gpu_tests.txt"
fi
if [ "${KERNEL_BENCH:-0}" = 1 ]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmark/sampler.py --out "$OUT/sampler.json" ${SAMPLER_ARGS:-} 2>&1 | tee "$OUT/sampler.txt"
  timeout 120 python3 tests/test_slot_head.py bench 2>&1 | tee "$OUT/slot_head.txt"
fi
if [ "${ATTENTION_BENCH:-0}" = 1 ]; then
  timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_attention.py 2>&1 | tail -5 \
    | tee "$OUT/decode_attention_tests.txt"
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmark/decode_attention.py ${ATTENTION_ARGS:-} 2>&1 \
    | grep -vi warn | tee "$OUT/decode_attention.txt"
fi
profile() {  # TAG TREE: the decode stages of both models from TREE
  for model in ${MODELS:-qwen3-tts orpheus}; do
    echo "===== $1 $model"
    (cd "$2" && source benchmark/gpu_env.sh && STAGES=decode BATCHES=${BATCHES:-1,4,16,64,256} TOP=${TOP:-16} \
      timeout "${STAGE_TIMEOUT:-200}" python3 benchmark/profile_stages.py --model "$model" --load-format dummy \
      --device cuda --max-model-len 1152 --max-batch-size "${MAX_BATCH:-256}" --max-codec-batch 16 --out "$OUT/$1_$model" 2>&1 \
      | grep -vE "USDT|profiler_st" | tee "$OUT/$1_$model.txt" | grep -E "decode|device total")
  done
}
if [ "${PROFILE:-0}" = 1 ]; then
  profile after .
  # DEPTH_AB=1: Qwen3-TTS's frame again with the depth transformer's one-kernel attention (rt/depth_attention.py)
  [ "${DEPTH_AB:-0}" = 1 ] && VOX_DEPTH_ATTENTION=1 MODELS=qwen3-tts profile depth_attention .
  # PDL_AB=1: both models again without programmatic dependent launch (rt/pdl.py, on by default on Hopper)
  [ "${PDL_AB:-0}" = 1 ] && VOX_PDL=0 profile no_pdl .
  # ORPHEUS_AB=1: Orpheus again with its step's bookkeeping as two kernels (models/orpheus/step_kernels.py)
  [ "${ORPHEUS_AB:-0}" = 1 ] && VOX_ORPHEUS_STEP_KERNELS=1 MODELS=orpheus profile orpheus_step .
  # STEP_AB=1: Qwen3-TTS again with the code predictor's one-position steps as one kernel each (rt/depth_step.py)
  [ "${STEP_AB:-0}" = 1 ] && VOX_DEPTH_STEP=1 MODELS=qwen3-tts profile depth_step .
  # FI_DECODE_AB=1: both models again with FlashInfer's decode at 1-2 rows (rt/attention/triton_decode.py off)
  [ "${FI_DECODE_AB:-0}" = 1 ] && VOX_TRITON_DECODE=0 profile flashinfer_decode .
  # ROWS_AB=1: both models again with lm_batch's PyTorch launch rows (rt/launch_rows.py off)
  [ "${ROWS_AB:-0}" = 1 ] && VOX_LAUNCH_ROWS=0 profile torch_rows .
  # TRITON_ROWS_AB=1: both models again with the planless Triton decode at every geometry and bucket up to TRITON_ROWS
  [ "${TRITON_ROWS_AB:-0}" = 1 ] && VOX_TRITON_DECODE=all VOX_TRITON_DECODE_ROWS=${TRITON_ROWS:-256} \
    profile triton_rows .
  [ -d "${TREE_BEFORE:-.before}" ] && VOX_SMALL_GEMM=0 profile before "${TREE_BEFORE:-.before}"
  # one archive: the device tool brings back only a few files per call (the summaries are on stdout above)
  (cd "$OUT" && tar czf profiles.tgz --remove-files $(ls -d ./*_orpheus* ./*_qwen3-tts* 2>/dev/null) && ls -la profiles.tgz)
fi
true

#!/usr/bin/env bash
# The float8 KV cache (--kv-cache-dtype fp8, served by the planless Triton attention backend) against the default
# (a bfloat16 cache, FlashInfer), in one device call on one GPU (results under $OUT), in this order:
#   0. (PARTS sweep) the Triton decode kernel's configurations over float8 caches, and FlashInfer's e4m3 decode,
#      alone (benchmark/decode_attention.py --configs CONFIGS); the best overall is set for the parts after it
#      (VOX_TRITON_DECODE_CONFIG);
#   1. Orpheus' offline workload (256 at once, benchmark/gpu_runtimes.sh, Rust runtime), the default and fp8
#      (the triton backend, then FlashInfer's e4m3 modules);
#   2. the GPU tier's checks of the Triton backend (tests/test_triton_attention.py; tests/test_gpu.py: the backend
#      against the PyTorch one in bfloat16 and float8, full-size Orpheus' graphs equal to its eager steps;
#      tests/test_rust_runtime.py: the Rust runtime's WAVs equal the Python runtime's with a float8 cache);
#   3. a lone Orpheus request's first steps (benchmark/gpu_ttfa_trace.sh), the default and fp8;
#   4. Orpheus' offline workload with the Triton backend over a bfloat16 cache (its kernels without the narrower
#      cache); Qwen3-TTS' offline workload, the default and fp8;
#   5. the captured decode step at 1, 64 and 256 rows of 512 tokens (benchmark/profile_stages.py), both caches.
# Each part runs while time is left of LIMIT seconds (default 560). Usage (repo root, carrying .whl from
# benchmark/gpu_wheels.sh, vox_serve/_rt.abi3.so from `pip install -e .`, and .fiaot.tgz):
#   VOX_GIT_COMMIT=$(git rev-parse --short HEAD) LIMIT=560 bash benchmark/gpu_kv_fp8.sh
# PARTS (default "tests offline ttfa qwen profile") picks parts; "sweep" comes first when named.
set -u
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-560}
PARTS=${PARTS:-tests offline ttfa qwen profile}
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
part() { [[ " $PARTS " == *" $1 "* ]]; }
offline() {  # model tag flags...: one offline run of the Rust runtime, while at least 60 s are left
  local model=$1 tag=$2; shift 2
  [ "$(left)" -gt 60 ] || { echo "$model $tag: skipped, $(left)s left"; return; }
  RS_EXTRA="$*" TAG=$tag TIMEOUT=$(( $(left) < 100 ? $(left) : 100 )) MODELS=$model PARTS=offline RUNTIMES=rust \
    bash benchmark/gpu_runtimes.sh 2>&1 | grep -E "rc=|^summary|rror"
}
ttfa() {  # model tag flags...: a lone request's first steps from its trace, while 60 s are left
  local model=$1 tag=$2; shift 2
  [ "$(left)" -gt 60 ] || { echo "ttfa $model $tag: skipped, $(left)s left"; return; }
  RS_EXTRA="$*" TAG=$tag MODELS=$model TIMEOUT=$(( $(left) < 90 ? $(left) : 90 )) \
    bash benchmark/gpu_ttfa_trace.sh 2>&1 | grep -E "rc=|^step +(1|2|28|29) |^steps|rror"
}
if part sweep; then
  CONFIGS=${CONFIGS:-32/4/2,64/4/2,64/8/2,128/4/2,128/8/2,128/8/3,64/4/3/h,128/8/2/h}
  timeout $(( $(left) < 140 ? $(left) : 140 )) python3 benchmark/decode_attention.py --kv-dtype fp8 --flashinfer \
    --geometry orpheus --rows 256,64 --kv 512,1024 --configs "$CONFIGS" 2>&1 | grep -v -i warn > "$OUT/sweep_fp8.txt"
  cat "$OUT/sweep_fp8.txt"
  best=$(sed -n 's/^best //p' "$OUT/sweep_fp8.txt")
  [ -n "$best" ] && export VOX_TRITON_DECODE_CONFIG=$best && echo "VOX_TRITON_DECODE_CONFIG=$best"
fi
if part offline; then
  offline orpheus bf16
  offline orpheus fp8 --kv-cache-dtype fp8
  offline orpheus fp8flashinfer --kv-cache-dtype fp8 --attention-backend flashinfer
fi
if part tests; then
  timeout "$(left)" python3 -m pytest -q -m gpu tests/test_triton_attention.py \
    "tests/test_gpu.py::test_triton_backend_equals_torch_backend" "tests/test_gpu.py::test_graph_replay_equals_eager" \
    "tests/test_gpu.py::test_flashinfer_reads_a_float8_cache_as_the_torch_backend_does" \
    "tests/test_rust_runtime.py::test_rust_bench_on_cuda_matches_python[orpheus-fp8]" \
    "tests/test_rust_runtime.py::test_rust_bench_on_cuda_matches_python[orpheus-fp8-flashinfer]" \
    -k "triton or fp8 or compiled or float8" \
    > "$OUT/tests.txt" 2>&1
  echo "tests rc=$?: $(tail -1 "$OUT/tests.txt" 2>/dev/null)"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -5
fi
if part ttfa; then
  ttfa orpheus bf16
  ttfa orpheus fp8 --kv-cache-dtype fp8
fi
if part offline; then
  offline orpheus tritonbf16 --attention-backend triton
fi
if part qwen; then
  offline qwen3-tts bf16
  offline qwen3-tts fp8 --kv-cache-dtype fp8
fi
if part profile; then
  for kv in auto fp8; do
    [ "$(left)" -gt 70 ] || { echo "profile $kv: skipped, $(left)s left"; continue; }
    STAGES=decode BATCHES=1,64,256 TOP=6 timeout $(( $(left) < 120 ? $(left) : 120 )) python3 benchmark/profile_stages.py \
      --model orpheus --load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 \
      --max-codec-batch 256 --kv-cache-dtype "$kv" > "$OUT/decode_orpheus_$kv.txt" 2>&1
    echo "profile $kv rc=$?"; grep -E "^decode x" "$OUT/decode_orpheus_$kv.txt"
  done
fi
echo "done in ${SECONDS}s"

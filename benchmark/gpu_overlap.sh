#!/usr/bin/env bash
# --overlap-detok against the whole engine, Rust runtime bench mode, on one GPU (benchmark/gpu_runtimes.sh's
# workloads, dummy weights): for each model of MODELS and part of PARTS (offline: 256 at once; rates: Poisson
# phases; single: one request), a run of the whole engine, then one with --overlap-detok, then (IN_FLIGHT_AB=1)
# one with VOX_CODEC_IN_FLIGHT=1, (PRIORITY_AB=N) one with VOX_OVERLAP_LM_PRIORITY=N, (SMS_AB=N) one with
# --overlap-detok --codec-sms N (the codec half on an N-SM partition), and (ASYNC=1, the default) one with
# --async-engines. Summaries on stdout; each run's --bench-json and log under $OUT, where gpu_runtimes.sh also packs
# them as runtimes.tgz (few files come back from the device machine). Then (TESTS=1)
# the GPU tier's check that the WAVs equal the whole engine's.
#
#   MODELS=qwen3-tts PARTS=offline bash benchmark/gpu_overlap.sh          # about 4 min on an H100/H200 (estimate)
#   MODELS="orpheus qwen3-tts" PARTS="offline rates" IN_FLIGHT_AB=1 bash benchmark/gpu_overlap.sh
#
# Dry run on CPU with the tiny models (seconds): DEVICE=cpu MODEL_SUFFIX=-tiny ORPHEUS_TOKENS=42 QWEN_FRAMES=24
#   OFFLINE_N=4 MAX_BATCH=8 TESTS=0 bash benchmark/gpu_overlap.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmark/gpu_env.sh  # the wheels installed once, for every pass below
export OUT
run() {  # tag env... : one gpu_runtimes.sh pass of the Rust runtime
  local tag=$1; shift
  env "$@" RUNTIMES=rust MODELS="${MODELS:-orpheus qwen3-tts}" PARTS="${PARTS:-offline}" TAG="$tag" \
    TIMEOUT="${TIMEOUT:-120}" bash benchmark/gpu_runtimes.sh 2>&1 | grep -E "rc=|^phase|^summary|rror"
}
run whole RS_EXTRA=
run overlap RS_EXTRA=--overlap-detok
[ "${IN_FLIGHT_AB:-0}" = 1 ] && run overlap1 RS_EXTRA=--overlap-detok VOX_CODEC_IN_FLIGHT=1
[ -n "${PRIORITY_AB:-}" ] && run overlapprio RS_EXTRA=--overlap-detok VOX_OVERLAP_LM_PRIORITY="$PRIORITY_AB"
[ -n "${SMS_AB:-}" ] && run "overlapsms$SMS_AB" RS_EXTRA="--overlap-detok --codec-sms $SMS_AB"
[ "${ASYNC:-1}" = 1 ] && run async RS_EXTRA=--async-engines
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-180}" python3 -m pytest -q -m gpu tests/test_overlap_detok.py 2>&1 | tail -2
fi

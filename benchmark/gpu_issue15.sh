#!/usr/bin/env bash
# The measures issue 15 still lacks, in one device call on one GPU (results under $OUT; about 9 min on an
# H100/H200, an estimate: each bench process also loads its model and captures its graphs, ~35 s):
#   1. Orpheus' offline workload (256 at once, benchmark/gpu_runtimes.sh) with the whole engine, --async-engines
#      and --overlap-detok, and Qwen3-TTS' with the whole engine and --async-engines; a lone request's first
#      steps (benchmark/gpu_ttfa_trace.sh), Orpheus' with and without the early hand-over of each step's PCM;
#   2. the GPU tier's checks that the Rust runtime's WAVs equal the Python runtime's (Orpheus-tiny, Qwen3-TTS-tiny:
#      the early PCM copy) and --async-engines' the whole engine's (Orpheus-tiny);
#   3. Orpheus' captured decode step at 1 row with the packaged table and with that table plus one entry (its
#      gate/up projection as rt/small_gemm's norm_gated kernel: the residual add, the norm and the SwiGLU gate
#      folded in; 1.02x alone on an H200, under the table's 1.03 bar, never measured in the step);
#   4. Orpheus' offline workload with --overlap-detok --codec-sms 48 (the codec half on a 48-SM partition).
# Each part runs while time is left of LIMIT seconds (default 540), so a short device budget still brings back
# the first ones. Usage (repo root, carrying .whl from benchmark/gpu_wheels.sh, vox_serve/_rt.abi3.so from
# `pip install -e .`, and .fiaot.tgz, FlashInfer's prebuilt modules: docs/offline-install.md):
#   VOX_GIT_COMMIT=$(git rev-parse --short HEAD) LIMIT=540 bash benchmark/gpu_issue15.sh
set -u
cd "$(dirname "$0")/.."
export VOX_SMALL_GEMM_TABLE=${VOX_SMALL_GEMM_TABLE:-vox_serve/rt/small_gemm_tables/nvidia-h200.json}
LIMIT=${LIMIT:-540}
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
left() { echo $((LIMIT - SECONDS)); }
offline() {  # model tag flags...: one offline run of the Rust runtime, while at least 60 s are left
  local model=$1 tag=$2; shift 2
  [ "$(left)" -gt 60 ] || { echo "$model $tag: skipped, $(left)s left"; return; }
  RS_EXTRA="$*" TAG=$tag TIMEOUT=$(( $(left) < 90 ? $(left) : 90 )) MODELS=$model PARTS=offline RUNTIMES=rust \
    bash benchmark/gpu_runtimes.sh 2>&1 | grep -E "rc=|^summary"
}
ttfa() {  # model [VOX_EARLY_PCM]: a lone request's first steps from its trace (gpu_ttfa_trace.sh), while 60 s are left
  [ "$(left)" -gt 60 ] || { echo "ttfa $1: skipped, $(left)s left"; return; }
  VOX_EARLY_PCM=${2:-1} TAG=$([ "${2:-1}" = 0 ] && echo late) MODELS=$1 TIMEOUT=$(( $(left) < 90 ? $(left) : 90 )) \
    bash benchmark/gpu_ttfa_trace.sh 2>&1 | grep -E "rc=|^step +(1|2|27|28|29|30) |^steps"
}
offline orpheus whole
ttfa orpheus 0  # each step's PCM with its LM rows
ttfa orpheus    # as soon as its codec launch is done (the default)
T=tests/test_rust_runtime.py::test_rust_bench_on_cuda_matches_python
[ "$(left)" -gt 60 ] && timeout "$(left)" python3 -m pytest -q -x -m gpu "$T[orpheus]" "$T[qwen3]" \
  "tests/test_overlap_detok.py::test_overlapped_codec_on_a_gpu_makes_the_whole_engines_audio[--async-engines-orpheus-tiny]" \
  > "$OUT/tests.txt" 2>&1
echo "tests rc=$?: $(tail -1 "$OUT/tests.txt" 2>/dev/null)"
offline orpheus async --async-engines
offline orpheus overlap --overlap-detok
offline qwen3-tts whole
ttfa qwen3-tts
offline qwen3-tts async --async-engines
# the packaged table plus Orpheus' gate/up at 1 row as norm_gated: [2, 512, 4, 0, 3, 0], the best configuration of
# benchmark/results/h200-2026-12-03/small_gemm.txt
GATED=/tmp/orpheus-gated-table.json
python3 - "$VOX_SMALL_GEMM_TABLE" "$GATED" <<'PY'
import json, sys
table = json.load(open(sys.argv[1]))
entry = {"kind": "gated", "dtype": "bfloat16", "rows": 1, "n": 8192, "k": 3072, "config": [2, 512, 4, 0, 3, 0]}
table["entries"].append(entry)
json.dump(table, open(sys.argv[2], "w"))
PY
A="--model orpheus --load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256"
for table in "$VOX_SMALL_GEMM_TABLE" "$GATED"; do
  [ "$(left)" -gt 50 ] || break
  name=decode_orpheus_$(basename "$table" .json).txt
  VOX_SMALL_GEMM_TABLE=$table STAGES=decode BATCHES=1 TOP=14 timeout "$(left)" python3 benchmark/profile_stages.py \
    $A > "$OUT/$name" 2>&1
  echo "$table: $(grep 'decode x' "$OUT/$name" | sed 's/eager_ms.*//')"
done
offline orpheus overlap_sms48 --overlap-detok --codec-sms 48  # the codec half on a 48-SM partition
cd "$OUT" && rm -f ./*.json ./*.log; ls

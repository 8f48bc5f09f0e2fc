#!/usr/bin/env bash
# The measures issue 15 still lacks, in one device call on one GPU (results under $OUT; about 9 min on an
# H100/H200, an estimate: each bench process also loads its model and captures its graphs, ~35 s):
#   1. Orpheus' offline workload (256 at once, benchmark/gpu_runtimes.sh) with the whole engine, --async-engines
#      and --overlap-detok, and Qwen3-TTS' with the whole engine and --async-engines; a lone request's first
#      steps (benchmark/gpu_ttfa_trace.sh), Orpheus' with and without the early hand-over of each step's PCM;
#   2. the GPU tier's checks that the Rust runtime's WAVs equal the Python runtime's (Orpheus-tiny, Qwen3-TTS-tiny:
#      the early PCM copy) and --async-engines' the whole engine's (Orpheus-tiny);
#   3. Orpheus' captured decode step at 1 row with the card's packaged small-GEMM table and with that table
#      toggled at one entry: its 1-row gate/up projection as rt/small_gemm's norm_gated kernel (the residual add,
#      the norm and the SwiGLU gate folded in). The H100 table has it (2.590 against 2.668 graph ms,
#      benchmark/results/h100-2026-12-07); the H200 table lacks it (1.02x alone there, never timed in the step);
#   4. Orpheus' offline workload with --overlap-detok --codec-sms 48 (the codec half on a 48-SM partition).
# Each part runs while time is left of LIMIT seconds (default 540), so a short device budget still brings back
# the first ones. Usage (repo root, carrying .whl from benchmark/gpu_wheels.sh, vox_serve/_rt.abi3.so from
# `pip install -e .`, and .fiaot.tgz, FlashInfer's prebuilt modules: docs/offline-install.md):
#   VOX_GIT_COMMIT=$(git rev-parse --short HEAD) LIMIT=540 bash benchmark/gpu_issue15.sh
set -u
cd "$(dirname "$0")/.."
LIMIT=${LIMIT:-540}
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
# the card's packaged table (rt/small_gemm.py table_path), unless VOX_SMALL_GEMM_TABLE names another
TABLE=${VOX_SMALL_GEMM_TABLE:-$(python3 -c 'import torch; from vox_serve.rt.small_gemm import table_path
print(table_path(torch.cuda.get_device_name(0)))')}
[ -f "$TABLE" ] || { echo "no small-GEMM table for this card ($TABLE): the unfused ops run"; }
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
# the table toggled at Orpheus' gate/up at 1 row as norm_gated ([2, 512, 4, 0, 3, 0], the best configuration of
# benchmark/results/h200-2026-12-03/small_gemm.txt): added where the table lacks it, removed where it has it
TOGGLED=/tmp/orpheus-gate-up-toggled.json
[ -f "$TABLE" ] && python3 - "$TABLE" "$TOGGLED" <<'PY'
import json, sys
table = json.load(open(sys.argv[1]))
entry = {"kind": "gated", "dtype": "bfloat16", "rows": 1, "n": 8192, "k": 3072, "config": [2, 512, 4, 0, 3, 0]}
same = [e for e in table["entries"] if {k: e[k] for k in ("kind", "rows", "n", "k")} == {k: entry[k] for k in ("kind", "rows", "n", "k")}]
table["entries"] = [e for e in table["entries"] if e not in same] if same else table["entries"] + [entry]
print("toggled table:", "without" if same else "with", "the 1-row gate/up as norm_gated")
json.dump(table, open(sys.argv[2], "w"))
PY
A="--model orpheus --load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256"
for table in "$TABLE" "$TOGGLED"; do
  [ -f "$table" ] && [ "$(left)" -gt 50 ] || continue
  name=decode_orpheus_$(basename "$table" .json).txt
  VOX_SMALL_GEMM_TABLE=$table STAGES=decode BATCHES=1 TOP=14 timeout "$(left)" python3 benchmark/profile_stages.py \
    $A > "$OUT/$name" 2>&1
  echo "$table: $(grep 'decode x' "$OUT/$name" | sed 's/eager_ms.*//')"
done
offline orpheus overlap_sms48 --overlap-detok --codec-sms 48  # the codec half on a 48-SM partition
cd "$OUT" && rm -f ./*.json ./*.log; ls

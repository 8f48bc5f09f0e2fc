#!/usr/bin/env bash
# Where a lone request's time to first audio goes (issue 11: over HTTP Orpheus-3B took 171-201 ms, bench
# mode 106 ms). Separates the configuration from the HTTP path, in one device call (results under $OUT):
#   1. bench mode, one request, --max-batch-size 8 / 64 / 256, with and without --async-scheduling;
#   2. the HTTP server at 256 with --async-scheduling: single requests back to back, then each after
#      IDLE_S seconds of idleness (an idle GPU lowers its clocks; an idle process sleeps in its poll).
# On CPU (orpheus-tiny) the API path from the client's request to the replica's first step measured
# ~3 ms with a kept-alive connection, so the HTTP path itself is not where 65-95 ms go.
# Usage (repo root): VOX_GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmark/gpu_ttfa.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmark/gpu_env.sh
MODEL=${MODEL:-orpheus}; TOKENS=${TOKENS:-1176}; IDLE_S=${IDLE_S:-5}
KW="{\"max_tokens\": $TOKENS, \"ignore_eos\": true}"
for batch in ${BATCHES:-8 64 256}; do
  for mode in "" --async-scheduling; do
    timeout 120 python3 -m vox_serve.launch --runtime python --model "$MODEL" --load-format dummy --device cuda \
      --max-model-len 1280 --max-batch-size "$batch" --max-codec-batch "$batch" --bench-requests 1 \
      --bench-kwargs "$KW" $mode > "$OUT/bench1_${batch}${mode:+_async}.txt" 2>&1
    echo "bench max-batch $batch ${mode:-sync}: $(grep -E '^bench-000' "$OUT/bench1_${batch}${mode:+_async}.txt")"
  done
done
start_server "$OUT/server.log" 8000 python3 -m vox_serve.launch --model "$MODEL" --load-format dummy --device cuda \
  --max-model-len 1280 --max-batch-size 256 --max-codec-batch 256 --async-scheduling --port 8000 || exit 1
L=(python3 benchmark/load.py --url http://127.0.0.1:8000 --max-tokens "$TOKENS" --offline 1)
for i in 1 2 3; do timeout 60 "${L[@]}" | tail -1 | sed "s/^/back-to-back $i: /"; done
for i in 1 2 3; do sleep "$IDLE_S"; timeout 60 "${L[@]}" | tail -1 | sed "s/^/after ${IDLE_S}s idle $i: /"; done
kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null
(cd "$OUT" && tar czf ttfa.tgz --remove-files ./*.txt server.log && ls -la ttfa.tgz)

#!/usr/bin/env bash
# One device-machine call: the HTTP load benchmark (dummy weights) and, optionally, the baseline.
# Starts the server, sweeps Poisson rates, runs an offline batch and a single request, then the
# transformers+SNAC baseline (BASELINE=1). Results land in $OUT as ${NAME}_*.json.
# Usage (repo root): MODEL=orpheus MAX_TOKENS=1024 RATES=4,8,16 bash benchmark/gpu_load.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
MODEL=${MODEL:-orpheus}; NAME=${NAME:-$MODEL}; MAX_TOKENS=${MAX_TOKENS:-1024}; PORT=${PORT:-8000}
SERVER=(python3 -m vox_serve.launch --model "$MODEL" --load-format dummy --device cuda --max-model-len "${MAX_MODEL_LEN:-1152}"
        --max-batch-size "${MAX_BATCH:-256}" --max-codec-batch "${MAX_BATCH:-256}" --port "$PORT" ${SERVER_EXTRA:-})
start_server "$OUT/${NAME}_server.log" "$PORT" "${SERVER[@]}" || exit 1
grep -E "weights|KV cache" "$OUT/${NAME}_server.log" | tail -1 | cut -c1-300
SETTINGS="${SERVER[*]}"
L=(python3 benchmark/load.py --url "http://127.0.0.1:$PORT" --max-tokens "$MAX_TOKENS" --settings "$SETTINGS" ${LOAD_EXTRA:-})
timeout 60 "${L[@]}" --offline 1 --out "$OUT/${NAME}_single.json" | tail -2
timeout "${LOAD_TIMEOUT:-300}" "${L[@]}" --rates "${RATES:-1,4,8,16}" --num-requests "${NUM_REQUESTS:-64}" \
  --out "$OUT/${NAME}_load.json" | tail -"${TAIL:-8}"
[ "${OFFLINE:-256}" -gt 0 ] && timeout 200 "${L[@]}" --offline "${OFFLINE:-256}" --out "$OUT/${NAME}_offline.json" | tail -2
kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null
grep -iE "error|Traceback" "$OUT/${NAME}_server.log" | head -5
if [ "${BASELINE:-0}" = 1 ]; then
  timeout 240 python3 benchmark/baseline.py --batch-sizes "${BASELINE_BATCHES:-1,64}" --max-tokens 1024 --out "$OUT/baseline.json"
fi

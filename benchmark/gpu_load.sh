#!/usr/bin/env bash
# One device-machine call: the HTTP load benchmark on Orpheus-3B (dummy weights) and the baseline.
# Starts the server, sweeps Poisson rates, runs an offline batch, then the transformers+SNAC
# baseline. Results land in $OUT. Usage (repo root): bash benchmark/gpu_load.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
export PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiws}
SERVER=(python3 -m vox_serve.launch --model orpheus --load-format dummy --device cuda --max-model-len 1152
        --max-batch-size "${MAX_BATCH:-256}" --max-codec-batch "${MAX_BATCH:-256}" --port 8000 ${SERVER_EXTRA:-})
"${SERVER[@]}" > "$OUT/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 180); do
  curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && break
  sleep 1
done
curl -s http://127.0.0.1:8000/health; echo
grep -E "weights|KV cache" "$OUT/server.log" | tail -2
SETTINGS="${SERVER[*]}"
timeout "${LOAD_TIMEOUT:-300}" python3 benchmark/load.py --rates "${RATES:-1,4,8,16}" --num-requests "${NUM_REQUESTS:-64}" \
  --max-tokens 1024 --settings "$SETTINGS" --out "$OUT/load.json"
timeout 200 python3 benchmark/load.py --offline "${OFFLINE:-256}" --max-tokens 1024 --settings "$SETTINGS" --out "$OUT/offline.json"
timeout 60 python3 benchmark/load.py --offline 1 --max-tokens 1024 --settings "$SETTINGS" --out "$OUT/single.json"
kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null
tail -5 "$OUT/server.log"
if [ "${BASELINE:-1}" = 1 ]; then
  timeout 240 python3 benchmark/baseline.py --batch-sizes "${BASELINE_BATCHES:-1,64}" --max-tokens 1024 --out "$OUT/baseline.json"
fi

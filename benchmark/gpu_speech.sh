#!/usr/bin/env bash
# One device-machine call: the cost of encoding in the OpenAI-compatible route. One server, then the same
# Poisson sweep through POST /generate (WAV/PCM), /v1/audio/speech as pcm, and /v1/audio/speech as opus,
# side by side. Results in $OUT as ${NAME}_{generate,speech_pcm,speech_opus}.json.
# Needs av, prometheus-client and websockets (wheels in .whl/, see docs/offline-install.md).
# Usage (repo root): MODEL=orpheus MAX_TOKENS=1024 RATES=8,12,16 bash benchmark/gpu_speech.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
MODEL=${MODEL:-orpheus}; NAME=${NAME:-$MODEL}; MAX_TOKENS=${MAX_TOKENS:-1024}; PORT=${PORT:-8000}
SERVER=(python3 -m vox_serve.launch --model "$MODEL" --load-format dummy --device cuda --max-model-len "${MAX_MODEL_LEN:-1152}"
        --max-batch-size "${MAX_BATCH:-256}" --max-codec-batch "${MAX_BATCH:-256}" --port "$PORT" --async-scheduling
        ${SERVER_EXTRA:-})
start_server "$OUT/${NAME}_server.log" "$PORT" "${SERVER[@]}" || exit 1
L=(python3 benchmark/load.py --url "http://127.0.0.1:$PORT" --max-tokens "$MAX_TOKENS" --settings "${SERVER[*]}"
   --rates "${RATES:-8,12,16}" --num-requests "${NUM_REQUESTS:-120}")
echo "== first request on the fresh server"
timeout 60 "${L[@]}" --offline 1 --out "$OUT/${NAME}_single.json" | tail -1  # also the warm-up
for run in generate speech_pcm speech_opus; do
  case $run in
    generate) args=();;
    speech_pcm) args=(--endpoint speech --response-format pcm);;
    speech_opus) args=(--endpoint speech --response-format opus);;
  esac
  echo "== $run"
  timeout "${LOAD_TIMEOUT:-240}" "${L[@]}" "${args[@]}" --out "$OUT/${NAME}_${run}.json" | tail -4
done
curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/${NAME}_metrics.txt"
kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null
grep -iE "error|Traceback" "$OUT/${NAME}_server.log" | head -5

#!/usr/bin/env bash
# Issue 16's Measure on a machine of 2 or 4 GPUs (one device-machine call; Python runtime, dummy weights):
#   1. data-parallel scaling of Orpheus' viable capacity: --dp-size 1, 2 (and 4 with 4 GPUs)
#      (goal: >= 1.9x at 2 GPUs, >= 3.8x at 4);
#   2. for Orpheus and Qwen3-TTS: --enable-disaggregation (LM on GPU 0, codec on GPU 1) vs 2 replicas vs 1 GPU:
#      TTFA p95 and viable capacity (the highest swept rate whose TTFA p95 stays under TTFA_TARGET_S with every
#      chunk of every stream on time).
# Each configuration is one benchmark/gpu_load.sh run (its server, a Poisson rate sweep of benchmark/load.py);
# results land in $OUT as <name>_load.json and a summary table in $OUT/multi_summary.txt.
# Usage (repo root): bash benchmark/gpu_multi.sh
#   GPUS (default: nvidia-smi's count), RATES_ORPHEUS / RATES_QWEN (comma-separated requests per second),
#   NUM_REQUESTS, MAX_TOKENS, TTFA_TARGET_S (default 1.0); ONLY=dp|disagg runs one of the two parts.
# ONLY=rust instead runs the Rust runtime's bench mode (benchmark/gpu_runtimes.sh, Orpheus, rates and 256 at
# once) with --dp-size 1, 2 (and 4), and --codec-gpu: 1 LM replica + the codec GPU on 2 GPUs, 3 + 1 on 4, then
# with the codec halves on a partition of CODEC_SMS (64) SMs (2 LM replicas, one sharing the codec GPU, on 2);
# RUST_PARTS (default "rates offline") and ORPHEUS_RATES / ORPHEUS_N pass through.
# Time: each configuration starts a server (1-2 min with graph capture) and sweeps its rates
# (NUM_REQUESTS per rate): about 4-6 min each; 6 configurations on 2 GPUs, 7 on 4. Keep a call within
# the device tool's limits by running ONLY=dp and ONLY=disagg in separate calls.
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmark/gpu_env.sh
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
RATES_ORPHEUS=${RATES_ORPHEUS:-4,8,16,24,32}
RATES_QWEN=${RATES_QWEN:-2,4,8,12,16}
TTFA_TARGET_S=${TTFA_TARGET_S:-1.0}
ONLY=${ONLY:-all}
export NUM_REQUESTS=${NUM_REQUESTS:-64} MAX_TOKENS=${MAX_TOKENS:-1024} OFFLINE=0 LOAD_TIMEOUT=${LOAD_TIMEOUT:-600}
if [ "$GPUS" -lt 2 ]; then echo "gpu_multi.sh needs 2 or more GPUs; $GPUS visible"; exit 1; fi

run() {  # NAME MODEL RATES SERVER_EXTRA...: one configuration through gpu_load.sh
  local name=$1 model=$2 rates=$3; shift 3
  echo "== $name: $model $*"
  NAME=$name MODEL=$model RATES=$rates SERVER_EXTRA="--runtime python $*" bash benchmark/gpu_load.sh
}

if [ "$ONLY" = all ] || [ "$ONLY" = dp ]; then
  run orpheus_dp1 orpheus "$RATES_ORPHEUS"
  run orpheus_dp2 orpheus "$RATES_ORPHEUS" --dp-size 2
  [ "$GPUS" -ge 4 ] && run orpheus_dp4 orpheus "$RATES_ORPHEUS" --dp-size 4
fi
if [ "$ONLY" = all ] || [ "$ONLY" = disagg ]; then
  [ "$ONLY" = disagg ] && run orpheus_dp1 orpheus "$RATES_ORPHEUS"
  [ "$ONLY" = disagg ] && run orpheus_dp2 orpheus "$RATES_ORPHEUS" --dp-size 2
  run orpheus_disagg orpheus "$RATES_ORPHEUS" --enable-disaggregation
  run qwen3_dp1 qwen3-tts "$RATES_QWEN"
  run qwen3_dp2 qwen3-tts "$RATES_QWEN" --dp-size 2
  run qwen3_disagg qwen3-tts "$RATES_QWEN" --enable-disaggregation
fi

if [ "$ONLY" = rust ]; then
  rust_bench() {  # TAG RS_EXTRA...
    local tag=$1; shift
    TAG=$tag RS_EXTRA="$*" RUNTIMES=rust MODELS=orpheus PARTS="${RUST_PARTS:-rates offline}" \
      ORPHEUS_RATES=${ORPHEUS_RATES:-8,16,24} bash benchmark/gpu_runtimes.sh
  }
  rust_bench dp1
  rust_bench dp2 --dp-size 2
  if [ "$GPUS" -ge 4 ]; then
    rust_bench dp4 --dp-size 4
    rust_bench codecgpu3 --dp-size 3 --codec-gpu 3
    rust_bench codecgpu3sms "--dp-size 3 --codec-gpu 3 --codec-sms ${CODEC_SMS:-64}"
  else
    rust_bench codecgpu1 --dp-size 1 --codec-gpu 1
    rust_bench codecgpu1sms "--dp-size 2 --codec-gpu 1 --codec-sms ${CODEC_SMS:-64}"
  fi
  exit 0
fi

python3 - "$OUT" "$TTFA_TARGET_S" <<'PY' | tee "$OUT/multi_summary.txt"
import json, pathlib, sys

out, target = pathlib.Path(sys.argv[1]), float(sys.argv[2])
def capacity(runs):
    ok = [float(r["rate"]) for r in runs if r["num_failed"] == 0 and r["ttfa_p95"] < target and r["all_chunks"] == 100.0]
    return max(ok, default=0.0)
rows = {}
for f in sorted(out.glob("*_load.json")):
    runs = json.loads(f.read_text())["runs"]
    rows[f.name.removesuffix("_load.json")] = (capacity(runs), min(r["ttfa_p95"] for r in runs))
print(f"viable capacity: highest rate with TTFA p95 < {target} s and every chunk on time")
print(f"{'config':<16} {'capacity':>9} {'vs 1 GPU':>9} {'best TTFA p95':>14}")
for name, (cap, ttfa) in rows.items():
    base = rows.get(name.split("_")[0] + "_dp1", (0.0, 0.0))[0]
    ratio = f"{cap / base:.2f}x" if base else "-"
    print(f"{name:<16} {cap:>9.1f} {ratio:>9} {ttfa:>14.3f}")
PY

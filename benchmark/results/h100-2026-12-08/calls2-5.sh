# Calls 2-5, run one after the other on the machine of call 1 (warm), from the repo root, carrying .whl,
# vox_serve/_rt.abi3.so and .fiaot.tgz; export VOX_GIT_COMMIT=a8ab5bb first.
# Call 2: the GPU tier's float8 checks, then the Qwen3-TTS frame at 1 and 16 rows and its offline workload, both weights
LIMIT=420 PARTS="tests qwen" bash benchmark/gpu_fp8_weights.sh
# Call 3: the 1-row float8 sweep of the Qwen3-TTS shapes, then the frame at 1 row with its winners
LIMIT=200 SWEEP_ROWS=1 SWEEP_MODELS=qwen3 PARTS=sweep bash benchmark/gpu_fp8_weights.sh
source benchmark/gpu_env.sh
QWEN="python3 benchmark/profile_stages.py --model qwen3-tts --load-format dummy --device cuda --max-model-len 1152
  --max-batch-size 256 --max-codec-batch 256 --quantization fp8"
ORPHEUS="python3 benchmark/profile_stages.py --model orpheus --load-format dummy --device cuda --max-model-len 1152
  --max-batch-size 256 --max-codec-batch 256 --quantization fp8"
VOX_SMALL_GEMM_TABLE=$OUT/small_gemm_fp8_table.json STAGES=decode BATCHES=1 TOP=6 $QWEN
# Call 4: Orpheus at 1 row, twice each, with the packaged entries (old: a8ab5bb's table) and with call 1's winners
# (new: /tmp/new.json, the four Orpheus entries now packaged, on top of the packaged table); then a lone request each
for round in 1 2; do for t in old new; do
  if [ $t = new ]; then export VOX_SMALL_GEMM_TABLE=/tmp/new.json; else unset VOX_SMALL_GEMM_TABLE; fi
  STAGES=decode BATCHES=1 TOP=6 $ORPHEUS > "$OUT/decode1_${t}_$round.txt"
done; done
for t in old new; do
  if [ $t = new ]; then export VOX_SMALL_GEMM_TABLE=/tmp/new.json; else unset VOX_SMALL_GEMM_TABLE; fi
  RS_EXTRA="--quantization fp8" TAG=w8_$t MODELS=orpheus TIMEOUT=80 bash benchmark/gpu_ttfa_trace.sh
done
# Call 5: the Qwen3-TTS frame at 1 row, twice each: no float8 entries (none), call 3's talker winners (talker, now
# packaged), its code-predictor winners (pred), all of them (all); /tmp/q_<name>.json on top of the packaged table
for round in 1 2; do for t in none talker pred all; do
  if [ $t = none ]; then unset VOX_SMALL_GEMM_TABLE; else export VOX_SMALL_GEMM_TABLE=/tmp/q_$t.json; fi
  STAGES=decode BATCHES=1 TOP=10 $QWEN > "$OUT/qdecode1_${t}_$round.txt"
done; done

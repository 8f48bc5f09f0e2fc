set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
TIMEOUT=120 MODELS="orpheus qwen3-tts" PARTS="single offline" RUNTIMES=rust timeout 300 bash benchmark/gpu_runtimes.sh 2>&1 | grep "summary\|rc=" | tail -12
rm -f $OUT/*.log $OUT/runtimes.tgz
A="--load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256"
for m in orpheus qwen3-tts; do
  STAGES=decode BATCHES=1,16,64,256 TOP=14 timeout 100 python3 benchmark/profile_stages.py --model $m $A > $OUT/decode_$m.txt 2>&1
  echo "$m decode rc=$?"; grep "decode x" $OUT/decode_$m.txt | sed 's/eager_ms.*//'
done

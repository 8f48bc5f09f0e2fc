set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
P="python3 benchmark/profile_stages.py --load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256"
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py -k "codecs" -x 2>&1 | tail -5
for m in qwen3-tts orpheus csm; do
  for g in 1 0; do
    VOX_CONV_GEMM=$g STAGES=codec TOP=14 timeout 240 $P --model $m > $OUT/codec_${m}_gemm$g.txt 2>&1
    echo "$m gemm=$g rc=$?"; grep "codec x" $OUT/codec_${m}_gemm$g.txt
  done
done
timeout 150 python3 benchmark/conv_gemm.py --windows 256 > $OUT/conv_gemm_256.txt 2>&1; echo "conv_gemm rc=$?"
grep "^x" $OUT/conv_gemm_256.txt

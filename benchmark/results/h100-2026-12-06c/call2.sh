set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
P="python3 benchmark/profile_stages.py --load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256"
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py -k "codecs" -x 2>&1 | tail -3
run() {  # model switch
  VOX_CONV_GEMM=$2 STAGES=codec TOP=14 timeout 240 $P --model $1 > $OUT/codec_$1_gemm$2.txt 2>&1
  echo "$1 VOX_CONV_GEMM=$2 rc=$?"; grep "codec x" $OUT/codec_$1_gemm$2.txt | cut -d'(' -f1,2 | sed 's/step_ms.*graph_ms/graph_ms/;s/eager_ms.*//'
}
run qwen3-tts ""; run qwen3-tts 0; run orpheus ""; run orpheus 0; run csm ""; run csm 0; run csm 1; run qwen3-tts 1

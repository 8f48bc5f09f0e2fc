set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
A="--load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256"
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py -k "codecs" -x 2>&1 | tail -3
run() {  # model switch max_channels
  VOX_CONV_GEMM=$2 STAGES=codec TOP=14 timeout 200 python3 -c "import runpy, sys; import vox_serve.rt.codec_kernels as k; k.GEMM_MAX_CHANNELS = $3; sys.argv = ['profile_stages.py', *sys.argv[1:]]; runpy.run_path('benchmark/profile_stages.py', run_name='__main__')" --model $1 $A > $OUT/codec_$1_gemm$2_max$3.txt 2>&1
  echo "$1 VOX_CONV_GEMM=$2 GEMM_MAX_CHANNELS=$3 rc=$?"; grep "codec x" $OUT/codec_$1_gemm$2_max$3.txt | sed 's/step_ms.*graph_ms/graph_ms/;s/eager_ms.*//'
}
run orpheus "" 256; run orpheus 0 256; run qwen3-tts "" 128; run qwen3-tts "" 256; run qwen3-tts 0 256

set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
A="--load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256"
timeout 120 python3 -c "import sys, pytest; import vox_serve.rt.codec_kernels as k; k.GEMM_MAX_DILATED_CHANNELS = 512; sys.exit(pytest.main(['-q', '-m', 'gpu', 'tests/test_gpu_kernels.py', '-k', 'codecs', '-x']))" 2>&1 | tail -2
run() {  # model max_dilated
  STAGES=codec BATCHES=16,64,256 TOP=14 timeout 150 python3 -c "import runpy, sys; import vox_serve.rt.codec_kernels as k; k.GEMM_MAX_DILATED_CHANNELS = $2; sys.argv = ['profile_stages.py', *sys.argv[1:]]; runpy.run_path('benchmark/profile_stages.py', run_name='__main__')" --model $1 $A > $OUT/codec_$1_dilated$2.txt 2>&1
  echo "$1 GEMM_MAX_DILATED_CHANNELS=$2 rc=$?"; grep "codec x" $OUT/codec_$1_dilated$2.txt | sed 's/step_ms.*graph_ms/graph_ms/;s/eager_ms.*//'
}
run qwen3-tts 256; run qwen3-tts 512
TIMEOUT=140 MODELS="orpheus qwen3-tts" PARTS="single offline" RUNTIMES=rust timeout 330 bash benchmark/gpu_runtimes.sh 2>&1 | grep -v "^\s*$" | tail -30

set -u
export VOX_SMALL_GEMM_TABLE=vox_serve/rt/small_gemm_tables/nvidia-h200.json
source benchmark/gpu_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
A="--load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256"

run() {  # model switch share
  VOX_L2_PREFETCH=$2 STAGES=decode BATCHES=1,16 TOP=16 timeout 100 python3 -c "import runpy, sys; import vox_serve.rt.l2_prefetch as k; k.BUDGET_SHARE = $3; sys.argv = ['profile_stages.py', *sys.argv[1:]]; runpy.run_path('benchmark/profile_stages.py', run_name='__main__')" --model $1 $A > $OUT/decode_$1_pf$2_share$3.txt 2>&1
  echo "$1 VOX_L2_PREFETCH=$2 BUDGET_SHARE=$3 rc=$?"; grep "decode x" $OUT/decode_$1_pf$2_share$3.txt | sed 's/eager_ms.*//'
}
run orpheus 0 0.5; run orpheus 1 0.5; run orpheus 1 0.8; run qwen3-tts 0 0.5; run qwen3-tts 1 0.5

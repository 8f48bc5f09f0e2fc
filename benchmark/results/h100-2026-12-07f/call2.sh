# Call 2's command (repo root on the device). .old_small_gemm.py was small_gemm.py of e12bbab, carried in the tree:
#   git show e12bbab:vox_serve/rt/small_gemm.py > .old_small_gemm.py
export VOX_GIT_COMMIT=4945d85
source benchmark/gpu_env.sh
P1="python3 benchmark/profile_stages.py --model orpheus --load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256 --quantization fp8"
mkdir -p /tmp/old && cp -r vox_serve benchmark /tmp/old/ && cp .old_small_gemm.py /tmp/old/vox_serve/rt/small_gemm.py
(cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old STAGES=decode BATCHES=1 TOP=6 timeout 80 $P1 > $OUT/decode1_old.txt 2>&1); echo "== old"; grep -A6 "^decode x" $OUT/decode1_old.txt | grep -v arn | cut -c1-140
STAGES=decode BATCHES=1 TOP=6 timeout 80 $P1 > $OUT/decode1_row.txt 2>&1; echo "== row"; grep -A6 "^decode x" $OUT/decode1_row.txt | grep -v arn | cut -c1-140
SWEEP_MODELS=orpheus LIMIT=$((${TOTAL:-560} - SECONDS)) PARTS="sweep profile offline" BATCHES=256 TOP=5 bash benchmark/gpu_fp8_gemm.sh

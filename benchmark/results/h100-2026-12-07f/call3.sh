# Call 3's command (repo root on the device, the packaged H100 float8 GEMM table in the tree)
source benchmark/gpu_env.sh; nvidia-smi --query-gpu=name --format=csv,noheader
P="python3 benchmark/profile_stages.py --model orpheus --load-format dummy --device cuda --max-model-len 1152 --max-batch-size 256 --max-codec-batch 256 --quantization fp8 --kv-cache-dtype fp8"
for t in cublas table; do e=1; [ $t = cublas ] && e=0; VOX_FP8_GEMM=$e STAGES=decode BATCHES=64 TOP=8 timeout 100 $P > $OUT/decode64_$t.txt 2>&1; echo "== $t"; grep -A9 "^decode x" $OUT/decode64_$t.txt | grep -v arn | cut -c1-120; done

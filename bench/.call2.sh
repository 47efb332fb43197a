set -u
OUT=$1/tl SMALL_ONLY=1 BIN=.carry
. bench/device_env.sh
carried_start "timeline f32 vs f16"
wait_model m4b2 120
for fmt in f32 f16 bf16 f32; do
  SPARK_CUDA_VERBOSE=1 SPARK_CUDA_TIMELINE=$OUT/tl_$fmt.jsonl timeout 60 $BIN/cuda_kv_bench /tmp/m4b2 --kv $fmt --ctx 1100 --depths 512 --decode 32 >$OUT/kvb_$fmt.txt 2>&1
  note "$fmt: $(grep RESULT $OUT/kvb_$fmt.txt) $(grep -o 'CUDA backend: .*' $OUT/kvb_$fmt.txt | head -c 600)"
  python3 bench/cuda_timeline.py $OUT/tl_$fmt.jsonl > $OUT/tl_$fmt.txt 2>&1
done
tests_k "attention_step_kernel_16bit or kv_format or kv_head_dim" 200
stamp done

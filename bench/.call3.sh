set -u
D=$1
OUT=$D/kv BIN=.carry BASE=.carry-base KVFMTS="f32 f16 bf16" DEPTHS=512,8192,32000 ROUNDS=1 TESTK="attention_step or kv_format or kv_head_dim or kv_chunked" MEMCHECK=1 bash bench/cuda_kvfmt_run.sh
OUT=$D/tl BIN=.carry REUSE_MODELS=1
. bench/device_env.sh
BIN=$(readlink -f .carry/bin)
for fmt in f16 f32; do
  SPARK_CUDA_TIMELINE=$OUT/tl_$fmt.jsonl timeout 60 $BIN/cuda_kv_bench /tmp/m4b2 --kv $fmt --ctx 1100 --depths 512 --decode 32 >$OUT/kvb_$fmt.txt 2>&1
  note "$fmt: $(grep RESULT $OUT/kvb_$fmt.txt)"
  python3 bench/cuda_timeline.py $OUT/tl_$fmt.jsonl 2>&1 | grep -E "^attention|step:" | tee -a $SUMMARY
done

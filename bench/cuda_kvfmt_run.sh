#!/bin/bash
# cuda_kvfmt_run.sh — decode speed by KV-cache number format on the 36-layer
# 4B shape at a few depths (bench/cuda_kv_bench.c: the cache rows filled
# with synthetic vectors, then single-token steps timed with their logits
# copied back), for one carry or for a BASE carry and a new one alternated;
# then optional: each format's step timeline on the 4-layer shape (the
# attention's phases), GPU tests, a memcheck of spark-tiny's decode over f16
# and bf16 caches. One device call:
#
#   BIN=.carry [BASE=.carry-base] [KVFMTS="f32 f16 bf16"] [DEPTHS=512,8192,32000]
#       [ROUNDS=2] [TIMELINE=1] [TESTK="pytest -k expression"] [MEMCHECK=1] bash bench/cuda_kvfmt_run.sh
#
# Both carries must hold cuda_kv_bench (ONLY="... cuda_kv_bench" for
# bench/cuda_carry.sh). Logs under $OUT (default /tmp/cuda-kvfmt).
set -u
OUT=${OUT:-/tmp/cuda-kvfmt}
. "$(dirname "$0")/device_env.sh"
carried_start "KV formats"
KVFMTS=${KVFMTS:-f32 f16 bf16}
DEPTHS=${DEPTHS:-512,8192,32000}
last=${DEPTHS##*,}
wait_model m4b || exit 1
for r in $(seq "${ROUNDS:-2}"); do
    for fmt in $KVFMTS; do
        for side in ${BASE:+base} new; do
            bin=$BIN
            [ "$side" = base ] && bin=$BASE
            line=$(timeout 120 "$bin/cuda_kv_bench" /tmp/m4b --kv "$fmt" --ctx $((last + 64)) --depths "$DEPTHS" \
                --decode 48 2>&1 | tee -a "$OUT/bench.log" | grep -E "^RESULT|rror" | tr '\n' ' ')
            note "round $r $side $fmt: $line"
        done
    done
done
if [ -n "${TIMELINE:-}" ]; then # where a step's time goes per format (4-layer shape, 512 keys; run 40)
    for fmt in $KVFMTS; do
        SPARK_CUDA_TIMELINE=$OUT/tl_$fmt.jsonl timeout 60 "$BIN/cuda_kv_bench" /tmp/m4b2 --kv "$fmt" --ctx 1100 \
            --depths 512 --decode 32 >>"$OUT/bench.log" 2>&1
        note "timeline $fmt:"
        python3 bench/cuda_timeline.py "$OUT/tl_$fmt.jsonl" 2>&1 | grep -E "^(kind|attention|step:)" | tee -a "$SUMMARY"
    done
fi
[ -n "${TESTK:-}" ] && tests_k "$TESTK" 300
if [ -n "${MEMCHECK:-}" ]; then # spark-tiny's decode over each 16-bit cache under compute-sanitizer
    for fmt in f16 bf16; do
        timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 "$SPARK_BIN" logits \
            models/spark-tiny --ids 3,4,5,6,7,8,9,10 --all --mode decode --gpu --kv-type $fmt --out /tmp/s.npy \
            >"$OUT/sanitizer-$fmt.log" 2>&1
        note "memcheck decode --kv-type $fmt: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer-$fmt.log" | tail -1)"
    done
fi
stamp done

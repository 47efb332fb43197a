#!/bin/bash
# cuda_kvfmt_run.sh — decode speed by KV-cache number format on the 36-layer
# 4B shape at a few depths (bench/cuda_kv_bench.c: the cache rows filled
# with synthetic vectors, then single-token steps timed with their logits
# copied back), for one carry or for a BASE carry and a new one alternated;
# then optional GPU tests and a memcheck of spark-tiny's decode over f16 and
# bf16 caches. One device call:
#
#   BIN=.carry [BASE=.carry-base] [KVFMTS="f32 f16 bf16"] [DEPTHS=512,8192,32000]
#       [ROUNDS=2] [TESTK="pytest -k expression"] [MEMCHECK=1] bash bench/cuda_kvfmt_run.sh
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

#!/bin/bash
# cuda_timeline_run.sh — one device call: where the 4B decode step's time
# goes at its kernel boundaries (SPARK_CUDA_TIMELINE, bench/cuda_timeline.py),
# with binaries built here and carried (bench/cuda_carry.sh).
#
#   BIN=.carry TLSWEEP="label:ENV=1,ENV2=2;..." [L2PROBE="21 42"] bash bench/cuda_timeline_run.sh
#
# 0. with L2PROBE="MB ..." bench/l2_probe first (carried as $BIN/l2_probe);
# 1. decode vs CPU on the 4-layer 4B shape (timeline off, then on: the
#    marks must not change a logit);
# 2. on the 36-layer 4B shape (bf16, ctx 4096, 512 prefilled, 256 decoded)
#    cuda_bench per TLSWEEP configuration (default "default:") without and
#    with the timeline, and the timeline's table for each;
# 2b. with QFMTS="q8_0 q4_k" the 36-layer model quantized here to each, and
#    cuda_bench per TLSWEEP configuration on it (timeline off; with
#    QTIMELINE=1 again with it on, and its table);
# 3. with TESTS=1 the GPU test files (test_cuda, test_cuda_hooks, test_bench,
#    test_pick); with TEST_ENV="VAR=V,..." test_cuda.py again under it;
# 4. a memcheck of spark-tiny's decode with the timeline on (and again under
#    MEMCHECK_ENV="VAR=V,..." when given).
set -u
OUT=${OUT:-/tmp/cuda-timeline}
BIN=${BIN:-.carry}
. "$(dirname "$0")/device_env.sh"
carried_start
if [ -n "${L2PROBE:-}" ] && [ -x "$BIN/l2_probe" ]; then # (bench/l2_probe.cu: L2 prefetch ahead of a streaming read)
    stamp "l2_probe $L2PROBE"
    timeout 60 "$BIN/l2_probe" $L2PROBE 2>&1 | tee -a "$SUMMARY"
fi

stamp "check: 4B shape, 4 layers, decode vs CPU, timeline off and on"
wait_model m4b2 120
timeout 200 python3 bench/decode_check.py /tmp/m4b2 default timeline:SPARK_CUDA_TIMELINE=$OUT/tl-check.jsonl ${CHECKX:-} 2>&1 |
    grep -v "^spark: CUDA" | tee -a "$SUMMARY"

stamp "36 layers: cuda_bench, then the same with the timeline"
wait_model m4b 300
IFS=';' read -r -a CONFIGS <<<"${TLSWEEP:-default:}"
# bench_line MODEL ENV...: cuda_bench's decode / generate lines on one line (the full output to bench.log)
bench_line() {
    local model=$1
    shift
    env "$@" timeout 90 "$BIN/cuda_bench" "$model" --ctx 4096 --prefill 512 --decode 256 ${CARD_TBS:+--card-tbs $CARD_TBS} 2>&1 |
        tee -a "$OUT/bench.log" | grep -E "^(decode|generate|card)|rror" | head -6 | tr '\n' ' '
}
for cfg in "${CONFIGS[@]}"; do
    label=${cfg%%:*}
    vars=$(echo "${cfg#*:}" | tr ',' ' ')
    for tl in off on; do
        tlv=""
        [ $tl = on ] && tlv="SPARK_CUDA_TIMELINE=$OUT/tl-$label.jsonl"
        note "$label [${cfg#*:}] timeline $tl: $(bench_line /tmp/m4b $vars $tlv)"
    done
    [ -s "$OUT/tl-$label.jsonl" ] && python3 bench/cuda_timeline.py "$OUT/tl-$label.jsonl" 2>&1 | tee -a "$SUMMARY"
done

for fmt in ${QFMTS:-}; do
    stamp "36 layers in $fmt"
    timeout 240 "$SPARK_BIN" quantize /tmp/m4b /tmp/m4b-$fmt.gguf --type $fmt -q 2>&1 | tail -1 | tee -a "$SUMMARY"
    for cfg in "${CONFIGS[@]}"; do
        label=$fmt-${cfg%%:*}
        vars=$(echo "${cfg#*:}" | tr ',' ' ')
        note "$fmt ${cfg%%:*} [${cfg#*:}]: $(bench_line /tmp/m4b-$fmt.gguf $vars)"
        if [ -n "${QTIMELINE:-}" ]; then
            note "$fmt ${cfg%%:*} [${cfg#*:}] timeline on: $(bench_line /tmp/m4b-$fmt.gguf $vars SPARK_CUDA_TIMELINE=$OUT/tl-$label.jsonl)"
            [ -s "$OUT/tl-$label.jsonl" ] && python3 bench/cuda_timeline.py "$OUT/tl-$label.jsonl" 2>&1 | tee -a "$SUMMARY"
        fi
    done
    rm -f /tmp/m4b-$fmt.gguf
done

if [ "${TESTS:-0}" = 1 ]; then
    stamp "tests"
    gpu_tests "$OUT/tests.log" "$GPU_TESTS"
fi
if [ -n "${TEST_ENV:-}" ]; then # test_cuda.py again under one more environment (VAR=V,VAR2=V2)
    stamp "test_cuda.py under $TEST_ENV"
    gpu_tests "$OUT/tests2.log" tests/py/test_cuda.py $(echo "$TEST_ENV" | tr ',' ' ')
fi

stamp "memcheck (spark-tiny decode, timeline on)"
memcheck_tiny "$OUT/sanitizer.log" SPARK_CUDA_TIMELINE=$OUT/tl-tiny.jsonl
note "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1); timeline lines: $(wc -l <"$OUT/tl-tiny.jsonl" 2>/dev/null)"
if [ -n "${MEMCHECK_ENV:-}" ]; then # the same under one more environment (VAR=V,VAR2=V2)
    memcheck_tiny "$OUT/sanitizer2.log" $(echo "$MEMCHECK_ENV" | tr ',' ' ')
    note "memcheck [$MEMCHECK_ENV]: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer2.log" | tail -1)"
fi
rm -f "$OUT/tl-check.jsonl" "$OUT/tl-tiny.jsonl" # (the device returns only a few files: keep the sweep's)
stamp done

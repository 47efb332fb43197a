#!/bin/bash
# cuda_decode_run.sh — one device call for decode-path work (issue 6) with
# binaries built on the development machine and carried: a correctness check
# of decode against the CPU on a 4-layer 4B-shaped model, a decode sweep over
# environment settings on the 36-layer 4B shape, the GPU test files, and a
# memcheck. Logs under $OUT.
#
#   BIN=.carry SWEEP="label:ENV=1,ENV2=2;label2:..." bash bench/cuda_decode_run.sh [quick|full]
#
# BIN: what bench/cuda_carry.sh packed (spark, cuda_bench, cuda_gemv_bench
# as .xz, the runtime .debs, optionally wheels/ such as the openai client
# for the GPU server test); unpacked here first. SWEEP: decode configurations, each run as
# `cuda_bench --ctx 4096 --prefill 512 --decode 256` with its variables set;
# `full` adds context 32k for the first two; `verify` leaves out the GEMV
# chains and `spark bench` (a short last check). TESTS=0 skips the test files.
# QUANT=1: the 36-layer model also quantized to Q8_0 and Q4_K here, decoded
# per QSWEEP configuration (default: the fast path and SPARK_CUDA_FAST=0), and
# their GEMV chains per QSWEEP configuration other than SPARK_CUDA_FAST=0.
# CHECKS: the decode check's variants (decode_check.py's NAME:VAR=V,...).
# XCHAINS: chain sets of bench/cuda_gemv_bench.cu run again under other
# settings, "SET:VAR=V,...;..." (SET: fgemv, or attn1 for the one-launch
# attention's), e.g. "attn1:SPARK_CUDA_ATTSTEP=8;fgemv:SPARK_CUDA_FG_DB=0".
# A previous build's cuda_gemv_bench copied into BIN as base_cuda_gemv_bench.xz
# (before cuda_carry.sh's next run replaces BIN): its chains and this build's,
# per format, one after the other (for changes a runtime switch cannot undo,
# such as a kernel's register count).
set -u
MODE=${1:-quick}
OUT=${OUT:-/tmp/cuda-decode}
BIN=${BIN:-.carry}
. "$(dirname "$0")/device_env.sh"
carried_start "$MODE"

stamp "check: 4B shape, 4 layers, 600 tokens, decode vs CPU"
wait_model m4b2 120
timeout 200 python3 bench/decode_check.py /tmp/m4b2 ${CHECKS:-default early-off:SPARK_CUDA_PDL_EARLY=0 attstep-off:SPARK_CUDA_ATTSTEP=0 cluster8:SPARK_CUDA_ATTSTEP=8} 2>&1 | tee -a "$SUMMARY"

stamp "decode sweep (36 layers, ctx 4096, 512 prefilled, 256 decoded)"
wait_model m4b 300
IFS=';' read -r -a CONFIGS <<<"${SWEEP:-default:}"
for cfg in "${CONFIGS[@]}"; do
    label=${cfg%%:*}
    vars=${cfg#*:}
    line=$(env $(echo "$vars" | tr ',' ' ') timeout 90 "$BIN/cuda_bench" /tmp/m4b --ctx 4096 --prefill 512 --decode 256 2>&1 |
        tee -a "$OUT/bench.log" | grep -E "^(decode|generate)|rror" | head -5 | tr '\n' ' ')
    note "$label [$vars]: $line"
done
if [ "${QUANT:-0}" = 1 ]; then # the 36-layer 4B shape quantized here, decoded with and without the fast path
    for fmt in q8_0 q4_k; do
        stamp "quantize to $fmt"
        timeout 240 "$SPARK_BIN" quantize /tmp/m4b /tmp/m4b-$fmt.gguf --type $fmt -q 2>&1 | tail -1 | tee -a "$SUMMARY"
        IFS=';' read -r -a QCONFIGS <<<"${QSWEEP:-default:;generic:SPARK_CUDA_FAST=0}"
        for cfg in "${QCONFIGS[@]}"; do
            vars=$(echo "${cfg#*:}" | tr ',' ' ')
            line=$(env $vars timeout 120 "$BIN/cuda_bench" /tmp/m4b-$fmt.gguf --ctx 4096 --prefill 512 --decode 256 2>&1 |
                tee -a "$OUT/bench.log" | grep -E "^(decode|generate)|rror" | head -5 | tr '\n' ' ')
            note "$fmt ${cfg%%:*} [${cfg#*:}]: $line"
        done
        for cfg in "${QCONFIGS[@]}"; do
            case "$cfg" in *SPARK_CUDA_FAST=0*) continue ;; esac
            [ -x "$BIN/cuda_gemv_bench" ] && env $(echo "${cfg#*:}" | tr ',' ' ') CHAINS=fgemv timeout 120 \
                "$BIN/cuda_gemv_bench" --layers 36 --reps 20 --dtype $fmt 2>&1 | sed "s/^/$fmt ${cfg%%:*} /" | tee -a "$SUMMARY"
        done
        rm -f /tmp/m4b-$fmt.gguf
    done
fi
if [ -x "$BIN/base_cuda_gemv_bench" ]; then # the previous build's chains carried as base_cuda_gemv_bench.xz
    stamp "A/B: the previous build's GEMV chains against this build's"
    for d in bf16 q8_0 q4_k; do
        for b in base_cuda_gemv_bench cuda_gemv_bench; do
            [ -x "$BIN/$b" ] && CHAINS=fgemv timeout 60 "$BIN/$b" --layers 36 --reps 20 --dtype $d 2>&1 | sed "s/^/ab $d $b /" | tee -a "$SUMMARY"
        done
    done
fi
if [ -x "$BIN/cuda_gemv_bench" ] && [ "$MODE" != verify ]; then
    stamp "GEMV chains and the attention path alone (bench/cuda_gemv_bench.cu)"
    timeout 120 "$BIN/cuda_gemv_bench" --layers 36 --reps 20 2>&1 | tee -a "$SUMMARY"
    IFS=';' read -r -a XC <<<"${XCHAINS:-}"
    for x in "${XC[@]}"; do
        env $(echo "${x#*:}" | tr ',' ' ') CHAINS="${x%%:*}" timeout 60 "$BIN/cuda_gemv_bench" --layers 36 --reps 20 2>&1 |
            sed "s/^/[${x#*:}] /" | tee -a "$SUMMARY"
    done
fi
if [ "$MODE" = full ]; then
    for cfg in "${CONFIGS[@]:0:2}"; do
        label=${cfg%%:*}
        vars=${cfg#*:}
        line=$(env $(echo "$vars" | tr ',' ' ') timeout 150 "$BIN/cuda_bench" /tmp/m4b --ctx 33300 --prefill 32512 --decode 128 2>&1 |
            tee -a "$OUT/bench.log" | grep -E "^(decode|prefill|generate)|rror" | tr '\n' ' ')
        note "ctx 32k $label [$vars]: $line"
    done
fi

if [ "${TESTS:-1}" = 1 ]; then
stamp "tests"
PYTHONPATH=tools:tests/py timeout 330 python3 -m pytest -q -p no:cacheprovider -rfEs tests/py/test_cuda.py \
    tests/py/test_cuda_hooks.py tests/py/test_bench.py tests/py/test_pick.py >"$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log" | tee -a "$SUMMARY"
grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/tests.log" | head -20 | tee -a "$SUMMARY"
grep -E "floor|tok/s" "$OUT/tests.log" | head -5 >>"$SUMMARY"
[ "$MODE" != verify ] && timeout 60 "$SPARK_BIN" bench /tmp/m4b2 --gpu -p 512 -n 64 2>&1 | tail -12 | tee -a "$SUMMARY"
fi

stamp "memcheck (spark-tiny decode)"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    "$SPARK_BIN" logits models/spark-tiny --ids 3,4,5,6,7,8,9,10 --all --mode decode --gpu --out /tmp/s.npy >"$OUT/sanitizer.log" 2>&1
note "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
"$SPARK_BIN" quantize models/spark-tiny /tmp/tiny-q4k.gguf --type q4_k -q >/dev/null 2>&1
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    "$SPARK_BIN" logits /tmp/tiny-q4k.gguf --ids 3,4,5,6,7,8,9,10 --all --mode decode --gpu --out /tmp/s.npy >"$OUT/sanitizer-q4k.log" 2>&1
note "memcheck (spark-tiny q4_k): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer-q4k.log" | tail -1)"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    "$SPARK_BIN" run -m models/spark-tiny -p "And God said," -n 12 --temp 0 --stop the --gpu >"$OUT/sanitizer-pick.log" 2>&1
note "memcheck (spark-tiny greedy run, device pick): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer-pick.log" | tail -1)"
stamp done

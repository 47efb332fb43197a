#!/bin/bash
# cuda_longctx_run.sh — one device call for decode at long context (issue 6's
# 32k row), binaries built here and carried (bench/cuda_carry.sh):
#
#   BIN=.carry SWEEP="label:VAR=V,...;..." [CHECKS="name:VAR=V,..."] [TEST_ENV=VAR=V,...] \
#       bash bench/cuda_longctx_run.sh
#
# 1. decode vs CPU on the 4-layer 4B shape (600 tokens) per CHECKS variant;
# 2. on the 36-layer 4B shape, cuda_bench at ctx CTX (default 32512; 128
#    decoded) per SWEEP configuration, the sweep run twice (alternating);
# 3. with TESTS=1 the GPU test files (test_cuda, test_cuda_hooks, test_bench,
#    test_pick); with TEST_ENV, test_cuda.py under it; a memcheck of spark-tiny's decode
#    under MEMCHECK_ENV (else TEST_ENV, else the default).
set -u
OUT=${OUT:-/tmp/cuda-longctx}
BIN=${BIN:-.carry}
. "$(dirname "$0")/device_env.sh"
carried_start

stamp "check: 4B shape, 4 layers, 600 tokens, decode vs CPU"
wait_model m4b2 120
timeout 200 python3 bench/decode_check.py /tmp/m4b2 ${CHECKS:-default} 2>&1 | grep -v "^spark: CUDA" | tee -a "$SUMMARY"

CTX=${CTX:-32512}
stamp "36 layers, ctx $CTX"
wait_model m4b 300
IFS=';' read -r -a CONFIGS <<<"${SWEEP:-default:}"
for round in 1 2; do
    for cfg in "${CONFIGS[@]}"; do
        label=${cfg%%:*}
        vars=${cfg#*:}
        line=$(env $(echo "$vars" | tr ',' ' ') timeout 150 "$BIN/cuda_bench" /tmp/m4b --ctx $((CTX + 788)) --prefill "$CTX" \
            --decode 128 2>&1 | tee -a "$OUT/bench.log" | grep -E "^(decode|generate \(greedy)|rror" | tr '\n' ' ')
        note "ctx $CTX $label [$vars] round $round: $line"
    done
done

if [ "${TESTS:-0}" = 1 ]; then
    stamp "tests"
    gpu_tests "$OUT/tests-all.log" "$GPU_TESTS"
fi
if [ -n "${TEST_ENV:-}" ]; then
    stamp "test_cuda.py under $TEST_ENV"
    gpu_tests "$OUT/tests.log" tests/py/test_cuda.py $(echo "$TEST_ENV" | tr ',' ' ')
fi
MC_ENV=${MEMCHECK_ENV:-${TEST_ENV:-}}
stamp "memcheck (spark-tiny decode${MC_ENV:+ under $MC_ENV})"
memcheck_tiny "$OUT/sanitizer.log" $(echo "$MC_ENV" | tr ',' ' ')
note "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
stamp done

#!/bin/bash
# cuda_longctx_run.sh — one device call for decode at long context (issue 6's
# 32k row), or for the issue's whole table, binaries built here and carried
# (bench/cuda_carry.sh):
#
#   BIN=.carry SWEEP="label:VAR=V,...;..." [CHECKS="name:VAR=V,..."] [TEST_ENV=VAR=V,...] \
#       bash bench/cuda_longctx_run.sh
#   BIN=.carry CTX="512 8192 32512" PREFILL_CHECK=1 QFMTS="q8_0 q4_k" TESTS=1 \
#       bash bench/cuda_longctx_run.sh          (the issue's table)
#   BIN=.carry BASE=.carry-base SWEEP="base:BIN=base;new:" ...   (before / after:
#       a configuration with BIN=base runs the BASE carry's cuda_bench)
#
# 1. decode vs CPU on the 4-layer 4B shape (600 tokens) per CHECKS variant
#    (with PREFILL_CHECK=1 the GPU's prefill against the CPU too, and the
#    same for that model quantized to each of QFMTS);
# 2. on the 36-layer 4B shape, cuda_bench at each context of CTX (default
#    32512, CTX="" none; that many tokens prefilled, 128 decoded) per SWEEP
#    configuration, the sweep run twice (alternating);
# 2b. with QFMTS="q8_0 q4_k" the 36-layer model quantized here to each (q4_k_m:
#    --type q4_k --recipe q4_k_m), and
#    cuda_bench at each context of QCTX (default 512) per SWEEP
#    configuration on it, twice;
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
timeout 200 python3 bench/decode_check.py /tmp/m4b2 ${PREFILL_CHECK:+--prefill} ${CHECKS:-default} 2>&1 | grep -v "^spark: CUDA" | tee -a "$SUMMARY"
if [ -n "${PREFILL_CHECK:-}" ]; then
    for fmt in ${QFMTS:-}; do
        stamp "check: the same model in $fmt, prefill and decode vs CPU"
        timeout 60 "$SPARK_BIN" quantize /tmp/m4b2 /tmp/m4b2-$fmt.gguf $(type_flags $fmt) -q 2>&1 | tail -1 | tee -a "$SUMMARY"
        timeout 200 python3 bench/decode_check.py /tmp/m4b2-$fmt.gguf --prefill ${CHECKS:-default} 2>&1 |
            grep -v "^spark: CUDA" | tee -a "$SUMMARY"
    done
fi

IFS=';' read -r -a CONFIGS <<<"${SWEEP:-default:}"
wait_model m4b 300
for ctx in ${CTX-32512}; do
    stamp "36 layers, ctx $ctx"
    for round in 1 2; do
        for cfg in "${CONFIGS[@]}"; do bench_ctx /tmp/m4b "$ctx" "${cfg%%:*}" "${cfg#*:}" $round; done
    done
done
for fmt in ${QFMTS:-}; do
    stamp "36 layers in $fmt, ctx ${QCTX:-512}"
    timeout 240 "$SPARK_BIN" quantize /tmp/m4b /tmp/m4b-$fmt.gguf $(type_flags $fmt) -q 2>&1 | tail -1 | tee -a "$SUMMARY"
    for round in 1 2; do
        for ctx in ${QCTX:-512}; do
            for cfg in "${CONFIGS[@]}"; do bench_ctx /tmp/m4b-$fmt.gguf "$ctx" "${cfg%%:*}" "${cfg#*:}" $round; done
        done
    done
    rm -f /tmp/m4b-$fmt.gguf
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

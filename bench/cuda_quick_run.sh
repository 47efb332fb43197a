#!/bin/bash
# cuda_quick_run.sh — a short device call (~4 minutes) for a change to the
# few-token GEMVs of the block formats, when the device time left is too
# little for cuda_longctx_run.sh; binaries built here and carried
# (bench/cuda_carry.sh):
#
#   BIN=.carry QFMTS="q6_k q4_0 q4_k_m" SWEEP="groups:SPARK_CUDA_QGEMV=groups;new:" \
#       [TESTK="q6_k or q4_0"] [ROUNDS=2] [MEMCHECK=1] bash bench/cuda_quick_run.sh
#
# Only the 4-layer 4B shape (no 36-layer model): for each of QFMTS, the GPU's
# prefill and decode against the CPU under every SWEEP variant, then
# cuda_bench per variant (prefill 512, decode 64 at ctx 512..576: four
# layers plus the head, whose 131072 rows are the format's too, so the
# GEMV's speed shows in the step), ROUNDS times alternating; test_cuda.py's
# cases matching TESTK; a memcheck of spark-tiny's decode (MEMCHECK=0: none).
set -u
OUT=${OUT:-/tmp/cuda-quick}
BIN=${BIN:-.carry}
. "$(dirname "$0")/device_env.sh"
export SMALL_ONLY=1
carried_start "quick"
IFS=';' read -r -a CONFIGS <<<"${SWEEP:-default:}"
variants="" # decode_check's NAME or NAME:VAR=V,... per SWEEP entry
for cfg in "${CONFIGS[@]}"; do variants="$variants ${cfg%:}"; done
wait_model m4b2 120
for fmt in ${QFMTS:-q6_k}; do
    stamp "$fmt: prefill and decode vs CPU, per variant"
    timeout 60 "$SPARK_BIN" quantize /tmp/m4b2 /tmp/m4b2-$fmt.gguf $(type_flags "$fmt") -q 2>&1 | tail -1 | tee -a "$SUMMARY"
    timeout 200 python3 bench/decode_check.py /tmp/m4b2-$fmt.gguf --prefill $variants 2>&1 |
        grep -v "^spark: CUDA" | tee -a "$SUMMARY"
    for round in $(seq "${ROUNDS:-2}"); do
        for cfg in "${CONFIGS[@]}"; do
            BENCH_DECODE=64 bench_ctx /tmp/m4b2-$fmt.gguf 512 "${cfg%%:*}" "${cfg#*:}" "$round"
        done
    done
done
tests_k "${TESTK:-q6_k or q4_0}" 200
if [ "${MEMCHECK:-1}" = 1 ]; then
    stamp "memcheck (spark-tiny decode)"
    memcheck_tiny "$OUT/sanitizer.log"
    note "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
fi
stamp "done"

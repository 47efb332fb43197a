#!/bin/bash
# cuda_smalln_run.sh — one device call: short prompts (a chat turn, a tool
# result) through the two product paths, GEMVs (weights streamed once per 4
# tokens) against GEMMs (cuBLAS; block formats decoded to bf16 panels first),
# on the 36-layer 4B shape in bf16 and quantized here to each of QFMTS;
# binaries built here and carried (bench/cuda_carry.sh):
#
#   BIN=.carry [LENS=2,4,...] [QFMTS="q8_0 q4_k"] [MODES="default;VAR=V,..."] [TESTK=expr] \
#       bash bench/cuda_smalln_run.sh
#
# For each model and each MODES environment (default: the backend's own
# choice, SPARK_CUDA_GEMV_TOKENS=1: every product of 2+ tokens a GEMM, =512:
# GEMVs up to 512 tokens), `cuda_bench --sweep LENS`: the fastest of three
# prefills of each length. With TESTK, the test_cuda.py tests it selects;
# with TESTS=1, the GPU test files (errors per check in errors.jsonl); with
# MEMCHECK=1, spark-tiny's prefill under compute-sanitizer.
set -u
OUT=${OUT:-/tmp/cuda-smalln}
BIN=${BIN:-.carry}
. "$(dirname "$0")/device_env.sh"
carried_start "short prompts: GEMV or GEMM"
LENS=${LENS:-2,4,8,12,16,24,32,48,64,96,128,192,256}
# MODES: ';'-separated environments (VAR=V,VAR=V; "default": none), one sweep each
sweep_model() {
    IFS=';' read -r -a modes <<<"${MODES:-default;SPARK_CUDA_GEMV_TOKENS=1;SPARK_CUDA_GEMV_TOKENS=512}"
    for mode in "${modes[@]}"; do
        local vars=""
        [ "$mode" != default ] && vars=$(echo "$mode" | tr ',' ' ')
        env $vars timeout 200 "$BIN/cuda_bench" "$1" --sweep "$LENS" 2>&1 | tee -a "$OUT/bench.log" |
            grep -E "^sweep|rror" | sed "s|^|$(basename "$1") [$mode] |" | tee -a "$SUMMARY"
    done
}
wait_model m4b 300
stamp "36 layers, bf16"
sweep_model /tmp/m4b
for fmt in ${QFMTS-q8_0 q4_k}; do
    stamp "36 layers in $fmt"
    timeout 240 "$SPARK_BIN" quantize /tmp/m4b /tmp/m4b-$fmt.gguf --type $fmt -q 2>&1 | tail -1 | tee -a "$SUMMARY"
    sweep_model /tmp/m4b-$fmt.gguf
    rm -f /tmp/m4b-$fmt.gguf
done
[ -n "${TESTK:-}" ] && tests_k "$TESTK"
if [ "${TESTS:-0}" = 1 ]; then
    stamp "GPU tests"
    SPARK_CUDA_REPORT=$OUT/errors.jsonl gpu_tests "$OUT/tests-all.log" "$GPU_TESTS"
fi
if [ -n "${MEMCHECK:-}" ]; then
    stamp "memcheck: spark-tiny prefill, 24 tokens (stacked GEMMs)"
    env SPARK_CUDA_VERBOSE=1 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
        "$SPARK_BIN" logits models/spark-tiny --ids $(seq -s, 3 26) --all --gpu --out /tmp/s.npy >"$OUT/sanitizer.log" 2>&1
    note "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1); $(grep -o 'products of 2+ tokens.*' "$OUT/sanitizer.log")"
fi
stamp done

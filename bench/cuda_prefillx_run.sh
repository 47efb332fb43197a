#!/bin/bash
# cuda_prefillx_run.sh — the prefill with x rounded to bf16 once
# (SPARK_CUDA_PREFILL_X=bf16: one tensor-core product a matrix, the
# published reference's precision) against the default hi + lo pair (x
# f32-accurate, two products), alternated in one device call:
#
#   BIN=.carry [CTXS="512 8192"] [QFMTS="q4_k"] [ROUNDS=2] [TESTK="pytest -k expression"]
#       bash bench/cuda_prefillx_run.sh
#
# cuda_bench's warmed-up prefill (and a short decode, unchanged by the
# setting) on the 36-layer 4B shape in bf16 and quantized to each of QFMTS;
# then `spark bench -p 512 -n 128` both ways, and an f16 cache's prefill
# (512 and 8192 tokens) with the tensor-core attention and without.
# Logs under $OUT.
set -u
OUT=${OUT:-/tmp/cuda-prefillx}
. "$(dirname "$0")/device_env.sh"
carried_start "prefill x in bf16"
[ -n "${TESTK:-}" ] && tests_k "$TESTK" 300
wait_model m4b || exit 1
models=/tmp/m4b
for fmt in ${QFMTS-q4_k}; do
    timeout 240 "$SPARK_BIN" quantize /tmp/m4b /tmp/m4b-$fmt.gguf $(type_flags "$fmt") -q 2>&1 | tail -1 | tee -a "$SUMMARY"
    models="$models /tmp/m4b-$fmt.gguf"
done
export BENCH_DECODE=16
for m in $models; do
    for ctx in ${CTXS:-512 8192}; do
        for r in $(seq "${ROUNDS:-2}"); do
            for x in hilo bf16; do bench_ctx "$m" "$ctx" "x $x" "SPARK_CUDA_PREFILL_X=$x" "$r"; done
        done
    done
done
for x in hilo bf16; do
    line=$(SPARK_CUDA_PREFILL_X=$x timeout 120 "$SPARK_BIN" bench /tmp/m4b --gpu -p 512 -n 128 2>&1 | tee -a "$OUT/bench.log" |
        grep -E "pp512|tg128|rror" | tr '\n' ' ')
    note "spark bench m4b x $x: $line"
done
# a 16-bit cache's prefill: the tensor-core attention against the coded kernels (SPARK_CUDA_FLASH=0)
for kv in ${KV16-f16}; do
    for p in 512 8192; do
        for fl in 0 1; do
            line=$(SPARK_CUDA_FLASH=$fl timeout 150 "$SPARK_BIN" bench /tmp/m4b --gpu -p $p -n 32 --kv-type $kv 2>&1 |
                tee -a "$OUT/bench.log" | grep -E "pp$p|tg32|rror" | tr '\n' ' ')
            note "spark bench m4b --kv-type $kv -p $p SPARK_CUDA_FLASH=$fl: $line"
        done
    done
done
stamp done

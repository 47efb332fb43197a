#!/bin/bash
# flash_ab_run.sh — one device call: the prefill attention (cuda_flash.cu)
# before / after a change, on the 36-layer 4B shape, and the checks of the
# new binary. Carried binaries (bench/cuda_carry.sh; both with flash_bench):
#
#   ONLY="spark cuda_bench flash_bench" WHEELS=.whl bash bench/cuda_carry.sh build-carry .carry
#   (in a worktree of the base commit) ONLY="cuda_bench flash_bench" bash bench/cuda_carry.sh build-carry .carry-base
#   BIN=.carry BASE=.carry-base [SWEEP="base:BIN=base;new:;staged:SPARK_CUDA_FLASH_PRESPLIT=0;new1:SPARK_CUDA_FLASH_SPLITS=1"] \
#       [PROMPTS="512 512 8192"] [CTX="512 8192"] [TESTK="flash"] bash bench/flash_ab_run.sh
#
# The default SWEEP's staged and new1 rows set SPARK_CUDA_FLASH_PRESPLIT=0
# and SPARK_CUDA_FLASH_SPLITS=1, which bench/pending/flash-prefill.patch adds
# (without it they run as new).
# 1. the decode / prefill check against the CPU (4-layer shape) and
#    test_cuda.py -k TESTK, while the 36-layer model is written; 2.
#    flash_bench (the prefill, and the attention launches alone with their
#    useful TFLOP/s) at each of PROMPTS, per SWEEP entry, ROUNDS (default 2)
#    alternated (each run is a new process: its first 512-token prefill pays
#    cuBLAS's first plans, hence 512 twice); 3. with CTX, cuda_bench's warm
#    prefill (and decode) at each of CTX the same way; 4. memcheck of
#    spark-tiny's prefill in chunks of 40 (key splits forced to 3, then as
#    chosen; an f16 cache).
set -u
OUT=${OUT:-/tmp/flash-ab}
BIN=${BIN:-.carry}
. "$(dirname "$0")/device_env.sh"
carried_start "flash A/B"
IFS=';' read -r -a CONFIGS <<<"${SWEEP:-base:BIN=base;new:;staged:SPARK_CUDA_FLASH_PRESPLIT=0;new1:SPARK_CUDA_FLASH_SPLITS=1}"
# flash_one LABEL VARS ROUND: flash_bench's lines for PROMPTS, one note each
flash_one() {
    sweep_env "$2"
    env $SWEEP_VARS timeout 150 "$SWEEP_BIN/flash_bench" /tmp/m4b --ctx 9000 ${PROMPTS:-512 512 8192} >"$OUT/flash.log" 2>&1
    grep -v "^spark: CUDA" "$OUT/flash.log" | grep -E "^prefill|rror" | sed "s/^/$1 [$2] round $3: /" |
        tee -a "$SUMMARY"
}
# the checks first: they need only the small models; the 36-layer one is written meanwhile
stamp "checks vs CPU (4-layer shape)"
wait_model m4b2 120
timeout 200 python3 bench/decode_check.py /tmp/m4b2 --prefill default 2>&1 | grep -v "^spark: CUDA" | tee -a "$SUMMARY"
[ -n "${TESTK-flash}" ] && tests_k "${TESTK-flash}" 300
wait_model m4b 300
stamp "flash_bench"
for round in $(seq "${ROUNDS:-2}"); do
    for cfg in "${CONFIGS[@]}"; do flash_one "${cfg%%:*}" "${cfg#*:}" $round; done
done
for ctx in ${CTX:-}; do
    stamp "cuda_bench, ctx $ctx"
    for round in $(seq "${ROUNDS:-2}"); do
        for cfg in "${CONFIGS[@]}"; do bench_ctx /tmp/m4b "$ctx" "${cfg%%:*}" "${cfg#*:}" $round; done
    done
done
IDS=$(python3 -c "print(','.join(str(3 + i * 37 % 3900) for i in range(200)))")
for mc in ${MEMCHECKS:-3:f32 0:f32 0:f16}; do # SPLITS:CACHE (0: as chosen)
    set -- ${mc/:/ }
    SPARK_CUDA_FLASH_SPLITS=$1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
        "$SPARK_BIN" logits models/spark-tiny --ids "$IDS" --all --gpu --batch 40 --kv-type $2 --out /tmp/c.npy \
        >"$OUT/mc$1$2.log" 2>&1
    note "memcheck, prefill in chunks of 40, splits ${1/#0/chosen}, $2 cache: rc=$? $(grep 'ERROR SUMMARY' "$OUT/mc$1$2.log")"
done
stamp done

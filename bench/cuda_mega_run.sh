#!/bin/bash
# cuda_mega_run.sh — one device call for the persistent decode step
# (cuda_step.cu, SPARK_CUDA_MEGA; bench/cuda_runs.md run 21: the dataflow
# version of commit 3792729 still awaits its first run) with binaries built here and carried
# (bench/cuda_carry.sh): the streaming probe alone (bench/flow_probe.cu),
# decode against the CPU on the 4-layer 4B shape per CHECKS variant, a sweep
# of decode configurations on the 36-layer 4B shape (greedy generation with
# the device pick, and decode with logits), optional tests, and memchecks of
# the persistent kernel. Logs under $OUT; the summary is printed as it goes.
#
#   BIN=.carry SWEEP="label:VAR=V,...;..." CHECKS="name:VAR=V ..." [PROBE=1] [TESTS=0] \
#       [CTX32K=label] [QUANT=0] [TESTK=pytest -k expression] bash bench/cuda_mega_run.sh
set -u
OUT=${OUT:-/tmp/cuda-mega}
BIN=${BIN:-.carry}
. "$(dirname "$0")/device_env.sh"
carried_start
if [ "${PROBE:-1}" = 1 ] && [ -x "$BIN/flow_probe" ]; then
    stamp "flow_probe (36 layers of the 4B shape's matrices)"
    timeout 120 "$BIN/flow_probe" 36 2>&1 | tee -a "$SUMMARY"
fi

stamp "check: 4B shape, 4 layers, 600 tokens, decode vs CPU"
wait_model m4b2 150
timeout 240 python3 bench/decode_check.py /tmp/m4b2 ${CHECKS:-default mega:SPARK_CUDA_MEGA=1} 2>&1 | tee -a "$SUMMARY"

stamp "decode sweep (36 layers, ctx 4096, 512 prefilled, 256 decoded)"
wait_model m4b 300
bench_line() { # label, model, extra cuda_bench args, env assignments...
    local label=$1 model=$2 args=$3
    shift 3
    local line
    line=$(env "$@" timeout 100 "$BIN/cuda_bench" "$model" $args 2>&1 | tee -a "$OUT/bench.log" |
        grep -E "^(decode|generate|prefill)|rror|persistent step|  (gemv|attn|embed) " | head -12 | tr '\n' ' ')
    note "$label [$*]: $line"
}
IFS=';' read -r -a CONFIGS <<<"${SWEEP:-default:;mega:SPARK_CUDA_MEGA=1}"
# a persistent step that failed its check (or hung in it) is not timed: a hang costs the call
mega_ok=1
grep -qE "check decode mega.*OK" "$SUMMARY" && grep -qE "persistent step kernel 1: [1-9]" "$SUMMARY" ||
    { mega_ok=0; note "the persistent step failed its check or did not run: not timed"; }
for cfg in "${CONFIGS[@]}"; do
    case "$cfg" in *SPARK_CUDA_MEGA=1*) [ $mega_ok = 1 ] || continue ;; esac
    bench_line "${cfg%%:*}" /tmp/m4b "--ctx 4096 --prefill 512 --decode 256" $(echo "${cfg#*:}" | tr ',' ' ')
done
if [ -n "${CTX32K:-}" ]; then
    for cfg in "${CONFIGS[@]}"; do
        case ",${CTX32K}," in *",${cfg%%:*},"*) ;; *) continue ;; esac
        bench_line "ctx 32k ${cfg%%:*}" /tmp/m4b "--ctx 33300 --prefill 32512 --decode 128" $(echo "${cfg#*:}" | tr ',' ' ')
    done
fi

if [ "${QUANT:-0}" = 1 ] && [ $mega_ok = 1 ]; then # Q8_0: the 4-layer check and the 36-layer sweep
    stamp "Q8_0: quantize, check, sweep"
    timeout 60 "$SPARK_BIN" quantize /tmp/m4b2 /tmp/m4b2-q8.gguf --type q8_0 -q 2>&1 | tail -1
    timeout 150 python3 bench/decode_check.py /tmp/m4b2-q8.gguf default mega:SPARK_CUDA_MEGA=1 2>&1 | sed 's/^/q8_0 /' | tee -a "$SUMMARY"
    if grep -qE "q8_0 check decode mega.*OK" "$SUMMARY" && grep -qE "q8_0 spark: .*persistent step kernel 1: [1-9]" "$SUMMARY"; then
        timeout 200 "$SPARK_BIN" quantize /tmp/m4b /tmp/m4b-q8.gguf --type q8_0 -q 2>&1 | tail -1
        IFS=';' read -r -a QC <<<"${QSWEEP:-default:;mega:SPARK_CUDA_MEGA=1}"
        for cfg in "${QC[@]}"; do
            bench_line "q8_0 ${cfg%%:*}" /tmp/m4b-q8.gguf "--ctx 4096 --prefill 512 --decode 256" $(echo "${cfg#*:}" | tr ',' ' ')
        done
        rm -f /tmp/m4b-q8.gguf
    fi
fi

if [ "${TESTS:-0}" = 1 ]; then
    stamp "tests (SPARK_CUDA_MEGA=${TEST_MEGA:-unset})"
    env ${TEST_MEGA:+SPARK_CUDA_MEGA=$TEST_MEGA} PYTHONPATH=tools:tests/py timeout 330 python3 -m pytest -q \
        -p no:cacheprovider -rfEs tests/py/test_cuda.py tests/py/test_cuda_hooks.py tests/py/test_bench.py \
        tests/py/test_pick.py ${TESTK:+-k "$TESTK"} >"$OUT/tests.log" 2>&1
    tail -3 "$OUT/tests.log" | tee -a "$SUMMARY"
    grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20 | tee -a "$SUMMARY"
fi

[ $mega_ok = 1 ] || { stamp done; exit 0; }
stamp "memcheck of the persistent step"
memcheck() { # log, then the command
    local log=$1
    shift
    SPARK_CUDA_MEGA=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 "$@" >"$OUT/$log" 2>&1
    note "memcheck $log: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/$log" | tail -1)"
}
memcheck sanitizer-tiny.log "$SPARK_BIN" logits models/spark-tiny --ids 3,4,5,6,7,8,9,10 --all --mode decode --gpu --out /tmp/s.npy
memcheck sanitizer-pick.log "$SPARK_BIN" run -m models/spark-tiny -p "And God said," -n 12 --temp 0 --gpu
memcheck sanitizer-4b2.log "$SPARK_BIN" logits /tmp/m4b2 --ids 5,6,7,8,9,10,11,12,13,14,15,16 --all --mode decode --gpu --out /tmp/s.npy
stamp done

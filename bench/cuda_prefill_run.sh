#!/bin/bash
# cuda_prefill_run.sh — where a GPU prefill's time goes, one device call,
# binaries built here and carried (bench/cuda_carry.sh):
#
#   BIN=.carry [N=512] [QFMTS="q8_0 q4_k"] [REUSE_MODELS=1] bash bench/cuda_prefill_run.sh
#
# 1. cuda_bench's warmed-up prefill of N tokens on the 36-layer 4B shape
#    (and on it quantized to each of QFMTS), for the totals;
# 2. the same prefill once under Nsight Compute with only each kernel's
#    duration collected (`ncu --clock-control none`, kernels serialised, so
#    their sum is the device's busy time without overlap), summed per kernel
#    name by bench/cuda_kernel_times.py: which kernels hold the time, and
#    against what the matrices' FLOPs need.
set -u
OUT=${OUT:-/tmp/cuda-prefill}
BIN=${BIN:-.carry}
. "$(dirname "$0")/device_env.sh"
carried_start "prefill split"
N=${N:-512}
IDS=$(python3 -c "import random; random.seed(7); print(','.join(str(random.randrange(3, 131072)) for _ in range($N)))")
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls "$CUDA_HOME"/bin/ncu 2>/dev/null)

# split MODEL LABEL: the totals, then the per-kernel sums
split() {
    stamp "$2: cuda_bench prefill $N"
    timeout 200 "$BIN/cuda_bench" "$1" --ctx $((N + 788)) --prefill "$N" --decode 8 2>&1 | tee -a "$OUT/bench.log" |
        grep -E "^prefill|rror" | tee -a "$SUMMARY"
    [ -n "$NCU" ] || { note "no ncu on this machine"; return; }
    stamp "$2: ncu, one prefill of $N tokens (spark logits)"
    timeout 400 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        "$SPARK_BIN" logits "$1" --ids "$IDS" --out /tmp/prefill-out.npy --gpu --ctx $((N + 16)) \
        >"$OUT/ncu-$2.csv" 2>"$OUT/ncu-$2.err"
    python3 bench/cuda_kernel_times.py "$OUT/ncu-$2.csv" --tokens "$N" 2>&1 | tee -a "$SUMMARY"
}
wait_model m4b 300
split /tmp/m4b bf16
for fmt in ${QFMTS:-}; do
    timeout 240 "$SPARK_BIN" quantize /tmp/m4b /tmp/m4b-$fmt.gguf $(type_flags "$fmt") -q 2>&1 | tail -1 | tee -a "$SUMMARY"
    split /tmp/m4b-$fmt.gguf "$fmt"
    rm -f /tmp/m4b-$fmt.gguf
done
stamp "done"

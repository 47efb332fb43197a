#!/bin/bash
# cuda_ncu_attn.sh — one device call: Nsight Compute on a decode step's
# kernels of the 4-layer 4B shape at context ~550 (graphs on, node-level
# profiling, so the kernels are the fused step's), with the per-instruction
# warp-stall samples of the one-launch attention, to see where its ~11 us
# go. Carried binaries (bench/cuda_carry.sh), as cuda_decode_run.sh:
#
#   BIN=.carry KERNELS=regex:attn_step SKIP=2200 COUNT=4 bash bench/cuda_ncu_attn.sh
#
# Writes under $OUT: details.csv (every section of each profiled kernel),
# sass.csv (the source page: SASS with stall samples per instruction).
set -u
OUT=${OUT:-/tmp/cuda-ncu}
BIN=${BIN:-.carry}
KERNELS=${KERNELS:-regex:attn_step} SKIP=${SKIP:-2200} COUNT=${COUNT:-4}
. "$(dirname "$0")/device_env.sh"
BIN=$(readlink -f "$BIN")
stamp "start on $(hostname)"
timeout 120 python3 bench/cuda_bench_model.py /tmp/m4b2 $SHAPE4B --layers 4 --max-ctx 4096 >"$OUT/models.log" 2>&1
IDS=$(seq -s, 3 602)
stamp "ncu: $KERNELS, skip $SKIP, count $COUNT"
timeout 300 ncu --clock-control none --graph-profiling node --kernel-name "$KERNELS" \
    --launch-skip "$SKIP" --launch-count "$COUNT" --set full --import-source no -f -o "$OUT/prof" \
    "$BIN/spark" logits /tmp/m4b2 --ids "$IDS" --mode decode --gpu --out /tmp/x.npy >"$OUT/ncu.log" 2>&1
note "ncu rc=$?: $(tail -2 "$OUT/ncu.log" | tr '\n' ' ')"
ncu --import "$OUT/prof.ncu-rep" --page details --csv >"$OUT/details.csv" 2>&1
ncu --import "$OUT/prof.ncu-rep" --page source --print-source sass --csv >"$OUT/sass.csv" 2>&1
note "details $(wc -l <"$OUT/details.csv") lines, sass $(wc -l <"$OUT/sass.csv") lines"
grep -E '"(Duration|Elapsed Cycles|Achieved Occupancy|Registers Per Thread|Block Limit Registers|Theoretical Occupancy)"' "$OUT/details.csv" | cut -c1-200 | tee -a "$SUMMARY"
stamp done

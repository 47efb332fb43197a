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
# the warps' stall samples by reason, per profiled kernel (is it waiting for
# instructions, memory, barriers?), and the kernel's SASS size
ncu --import "$OUT/prof.ncu-rep" --page raw --csv >"$OUT/raw.csv" 2>&1
python3 - "$OUT/raw.csv" <<'PY' 2>&1 | tee -a "$SUMMARY"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0]
cols = [i for i, h in enumerate(head) if h.startswith("smsp__pcsamp_warps_issue_stalled_") and not h.endswith("_not_issued")]
for r in rows[2:]:
    if len(r) != len(head):
        continue
    vals = []
    for i in cols:
        try:
            vals.append((float(r[i].replace(",", "")), head[i][len("smsp__pcsamp_warps_issue_stalled_"):]))
        except ValueError:
            pass
    tot = sum(v for v, _ in vals) or 1
    top = sorted(vals, reverse=True)[:8]
    print("stall samples:", ", ".join(f"{n} {100 * v / tot:.0f}%" for v, n in top), f"(total {tot:.0f})")
PY
command -v cuobjdump >/dev/null && cuobjdump -sass "$BIN/spark" 2>/dev/null |
    awk '/Function :/{name=$3} /^ +\/\*[0-9a-f]+\*\//{c[name]++} END{for (n in c) print "sass instructions", c[n], n}' |
    grep -E "attn_step|fgemv_kernelINS_8fmt_bf16ELi10ELi1ELb0ELb1EE" | head -8 | tee -a "$SUMMARY"
grep -E '"(Duration|Elapsed Cycles|Achieved Occupancy|Registers Per Thread|Block Limit Registers|Theoretical Occupancy)"' "$OUT/details.csv" | cut -c1-200 | tee -a "$SUMMARY"
stamp done

#!/bin/bash
# cuda_kv_run.sh — issue 7 on a GPU machine in one call: the coded KV caches'
# correctness tests and the scale table (bench/cuda_kv_bench.c). Logs under
# $OUT (default /tmp/cuda-kv), a summary last.
#
#   bash bench/cuda_kv_run.sh [BIN_DIR]
#
# BIN_DIR (default build-h2): a directory holding `spark` and `cuda_kv_bench`
# built elsewhere for sm_90a (carried: saves the device the build); when they
# do not run here, both are built (make BUILD=build-gpu, sm_90a only).
# Stages, each continuing after a failure:
#   deps    system libraries missing here, unpacked from .devdeps/*.deb
#   model   the 4B-shaped 36-layer bf16 model with max_ctx 1,048,576
#           (bench/cuda_bench_model.py), written in the background
#   probe   device-to-device copy bandwidth (torch)
#   tests   tests/py/test_cuda.py's KV-format and memory tests (errors per
#           check in $OUT/errors.jsonl)
#   bench   per format: accounting (largest context) + decode at depths
#           32k / 128k / ~1M from a synthetic fill
#   old     (KV_OLD="f16 tq4") the same formats at 128k / 1M with the first
#           attention kernel (SPARK_CUDA_KV_ATTN=0), for comparison
#   sanit   compute-sanitizer memcheck, spark-tiny, --kv-bits 3.5, decode
set -u
BIN=${1:-build-h2}
OUT=${OUT:-/tmp/cuda-kv}
. "$(dirname "$0")/device_env.sh"
stamp "start on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total,memory.used --format=csv 2>&1 | tee -a "$SUMMARY"

( timeout 300 python3 bench/cuda_bench_model.py /tmp/m4b $SHAPE4B --layers 36 --max-ctx 1048576 >"$OUT/model.log" 2>&1
  echo done >/tmp/model.done ) &


if "$BIN/spark" --help >/dev/null 2>&1 && "$BIN/cuda_kv_bench" 2>&1 | grep -q usage; then
    note "binaries: carried ($BIN)"
else
    stamp "build (carried binaries do not run: $("$BIN/spark" --help 2>&1 | tail -1))"
    BIN=build-gpu
    if timeout 300 make -j"$(nproc)" BUILD=build-gpu NVCCFLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a" \
        build-gpu/spark >"$OUT/build.log" 2>&1 &&
        gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o build-gpu/cuda_kv_bench bench/cuda_kv_bench.c \
            build-gpu/libspark.a $LIBS >>"$OUT/build.log" 2>&1; then
        note "build: ok"
    else
        note "build: FAILED"; tail -30 "$OUT/build.log" | tee -a "$SUMMARY"; exit 1
    fi
fi
export SPARK_BIN=$ROOT/$BIN/spark

stamp probe
probe_copy_bandwidth 2>&1 | tail -1 | tee -a "$SUMMARY"

stamp tests
export SPARK_CUDA_REPORT=$OUT/errors.jsonl
: >"$SPARK_CUDA_REPORT"
PYTHONPATH=tools:tests/py timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/py/test_cuda.py \
    -k "kv or memory or tq4 or greedy" >"$OUT/tests.log" 2>&1
grep -E "passed|failed|Error|assert" "$OUT/tests.log" | tail -15 | tee -a "$SUMMARY"
python3 - "$SPARK_CUDA_REPORT" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(f"err {r['max_rel_l2']:.3g}  {r['check']}")
EOF

stamp "bench: waiting for the model"
for _ in $(seq 200); do [ -f /tmp/model.done ] && break; sleep 1; done
tail -2 "$OUT/model.log" | tee -a "$SUMMARY"
for fmt in f16 tq4 tq3.5 tq3 tq2 bf16 f32; do
    [ $(($(date +%s) - T0)) -gt 330 ] && { note "bench $fmt: skipped (time)"; continue; }
    timeout 90 "$BIN/cuda_kv_bench" /tmp/m4b --kv $fmt --ctx 1048576 --depths 32768,131072,1048000 --decode 24 \
        >"$OUT/bench_$fmt.log" 2>&1
    note "bench $fmt: rc=$?"
    grep -E "^(FIT|SESSION|RESULT|DEPTH)|error|rror" "$OUT/bench_$fmt.log" | tee -a "$SUMMARY"
done
for fmt in ${KV_OLD:-}; do
    [ $(($(date +%s) - T0)) -gt 330 ] && continue
    note "bench $fmt, first kernel (SPARK_CUDA_KV_ATTN=0: a warp-wide dot product per key and head):"
    SPARK_CUDA_KV_ATTN=0 timeout 60 "$BIN/cuda_kv_bench" /tmp/m4b --kv $fmt --ctx 1048576 --depths 131072,1048000 \
        --decode 16 >"$OUT/bench_old_$fmt.log" 2>&1
    grep -E "^RESULT|error|rror" "$OUT/bench_old_$fmt.log" | tee -a "$SUMMARY"
done
cat "$OUT"/bench_*.log >"$OUT/bench.log" 2>/dev/null; rm -f "$OUT"/bench_*.log

if [ $(($(date +%s) - T0)) -lt 360 ]; then
    stamp sanitizer
    IDS=$(python3 -c "print(','.join(str(i) for i in range(3, 35)))")
    timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
        "$SPARK_BIN" logits models/spark-tiny --ids "$IDS" --all --mode decode --gpu --kv-bits 3.5 --kv-layers all \
        --out /tmp/s.npy >"$OUT/sanitizer.log" 2>&1
    note "memcheck spark-tiny decode tq3.5 all layers: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
fi
stamp done

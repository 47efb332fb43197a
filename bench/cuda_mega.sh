#!/bin/bash
# cuda_mega.sh — one device call for the persistent decode-step kernel
# (src/backend/cuda/cuda_step.cu, SPARK_CUDA_MEGA): build, check it against
# the CPU and the graph path (SPARK_CUDA_MEGA=0, the default), time decode both ways on
# the 4B shape, run tests/py/test_cuda.py and a memcheck. Logs under $OUT.
#
#   bash bench/cuda_mega.sh [quick|full]
set -u
MODE=${1:-quick}
OUT=${OUT:-/tmp/cuda-mega}
. "$(dirname "$0")/device_env.sh"
# the kernel is opt-in: every run below uses it unless it says SPARK_CUDA_MEGA=0
export SPARK_CUDA_MEGA=1
stamp "start ($MODE) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null) + working tree"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$SUMMARY"

( timeout 120 python3 bench/cuda_bench_model.py /tmp/m4b2 $SHAPE4B --layers 4 --max-ctx 4096 >"$OUT/models.log" 2>&1
  timeout 240 python3 bench/cuda_bench_model.py /tmp/m4b $SHAPE4B --layers 36 --max-ctx 40960 >>"$OUT/models.log" 2>&1
  echo done >/tmp/models.done ) &

stamp build
BD=build-mega-$(date +%s)
if timeout 300 make -j"$(nproc)" BUILD=$BD NVCCFLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a" \
        $BD/spark >"$OUT/build.log" 2>&1 &&
    gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -o $BD/cuda_bench bench/cuda_bench.c $BD/libspark.a $LIBS \
        >>"$OUT/build.log" 2>&1; then
    note "build: ok"
else
    note "build: FAILED"; tail -30 "$OUT/build.log" | tee -a "$SUMMARY"; exit 1
fi
SPARK=$BD/spark
export SPARK_BIN=$ROOT/$SPARK

stamp "check: spark-tiny decode, mega vs graph vs cpu"
IDS=$(python3 -c "print(','.join(str(i) for i in range(3, 83)))")
timeout 60 $SPARK logits models/spark-tiny --ids "$IDS" --all --out /tmp/tc.npy >"$OUT/check.log" 2>&1
SPARK_CUDA_VERBOSE=1 timeout 60 $SPARK logits models/spark-tiny --ids "$IDS" --all --mode decode --gpu --out /tmp/tm.npy >>"$OUT/check.log" 2>&1
echo "rc mega $?" >>"$OUT/check.log"
SPARK_CUDA_MEGA=0 timeout 60 $SPARK logits models/spark-tiny --ids "$IDS" --all --mode decode --gpu --out /tmp/tg.npy >>"$OUT/check.log" 2>&1
python3 - >>"$OUT/check.log" 2>&1 <<'EOF2'
import numpy as np
def rel(a, b): return (np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)).max()
c, m, g = (np.load(f"/tmp/t{x}.npy").astype(np.float64) for x in "cmg")
print(f"check spark-tiny decode: mega vs cpu {rel(m, c):.3g}, graph vs cpu {rel(g, c):.3g}, mega vs graph {rel(m, g):.3g}")
EOF2
grep -E "^check|launches|rc mega|rror" "$OUT/check.log" | tee -a "$SUMMARY"

stamp "check: 4B shape, 4 layers, 600 tokens"
for _ in $(seq 120); do grep -q "m4b2" "$OUT/models.log" 2>/dev/null && break; [ -f /tmp/models.done ] && break; sleep 1; done
timeout 150 python3 bench/decode_check.py /tmp/m4b2 mega "graph (MEGA=0):SPARK_CUDA_MEGA=0" >>"$OUT/check.log" 2>&1
grep -E "^check decode|launches" "$OUT/check.log" | tail -4 | tee -a "$SUMMARY"
note "-- profile, 4 layers (block 0; SPARK_CUDA_MEGA_PROF=2), ctx ~600:"
SPARK_CUDA_MEGA_PROF=2 timeout 60 $SPARK logits /tmp/m4b2 --ids $(python3 -c "print(','.join(str(i) for i in range(3, 603)))") \
    --mode decode --gpu --ctx 4096 --out /tmp/p.npy 2>&1 | grep "spark:" | tee -a "$SUMMARY"

stamp "bench (36 layers)"
for _ in $(seq 240); do [ -f /tmp/models.done ] && break; sleep 1; done
bench() { timeout "$1" $BD/cuda_bench /tmp/m4b "${@:2}" 2>&1 | tee -a "$OUT/bench.log" | grep -E "^(prefill|decode)|rror|spark:  " | tee -a "$SUMMARY"; }
note "-- mega:"; bench 60 --ctx 4096 --prefill 512 --decode 256
note "-- graph (MEGA=0):"; SPARK_CUDA_MEGA=0 bench 60 --ctx 4096 --prefill 512 --decode 256
note "-- mega again (with the profile):"; SPARK_CUDA_MEGA_PROF=1 bench 60 --ctx 4096 --prefill 512 --decode 256
grep -A4 "step profile" "$OUT/bench.log" | tail -5 | tee -a "$SUMMARY"
if [ "$MODE" = full ]; then
    note "-- mega ctx 32k:"; bench 120 --ctx 32768 --prefill 32512 --decode 128
fi

stamp "tests"
PYTHONPATH=tools:tests/py timeout 200 python3 -m pytest -q -x -p no:cacheprovider -rfEs tests/py/test_cuda.py >"$OUT/tests.log" 2>&1
tail -4 "$OUT/tests.log" | tee -a "$SUMMARY"

stamp "memcheck (mega, spark-tiny decode)"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    $SPARK logits models/spark-tiny --ids 3,4,5,6,7,8,9,10 --all --mode decode --gpu --out /tmp/s.npy >"$OUT/sanitizer.log" 2>&1
note "memcheck: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
stamp done

#!/bin/bash
# cuda_hooks_check.sh — the instruments on the GPU (issue 8, CUDA side) in
# one device call: tests/py/test_cuda_hooks.py, a decode step with steering
# replayed as a graph (SPARK_CUDA_VERBOSE), and decode tokens/s with each
# instrument off / on (spark bench --gpu) on spark-tiny and on a 4B-shaped
# bf16 model of a few layers (bench/cuda_bench_model.py). Logs under $OUT.
#
#   SPARK_BIN=path/to/spark bash bench/cuda_hooks_check.sh [LAYERS]
#
# SPARK_BIN: a binary built elsewhere (carried); when it is missing or does
# not start here, the script builds build-h4/spark (sm_90a only).
set -u
OUT=${OUT:-/tmp/cuda-hooks}
LAYERS=${1:-8}
. "$(dirname "$0")/device_env.sh"

stamp "start on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$SUMMARY"

( timeout 150 python3 bench/cuda_bench_model.py /tmp/m4b $SHAPE4B --layers "$LAYERS" --max-ctx 4096 \
    >/tmp/model.log 2>&1; echo done >/tmp/m4b.done ) &

SPARK=${SPARK_BIN:-build-h4/spark}
if ! "$SPARK" --help >/dev/null 2>&1; then
    note "carried binary missing or not runnable ($(ldd "$SPARK" 2>&1 | grep -c 'not found') libraries not found): building"
    stamp build
    timeout 400 make -j16 BUILD=build-h4 NVCCFLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a" \
        build-h4/spark >"$OUT/build.log" 2>&1 || { note "build FAILED"; tail -20 "$OUT/build.log"; exit 1; }
    SPARK=build-h4/spark
fi
export SPARK_BIN=$(readlink -f "$SPARK")

stamp "tests: tests/py/test_cuda_hooks.py"
export SPARK_CUDA_REPORT=$OUT/errors.jsonl
: >"$SPARK_CUDA_REPORT"
PYTHONPATH=tools:tests/py timeout 110 python3 -m pytest -q -p no:cacheprovider -rfEs tests/py/test_cuda_hooks.py \
    --tb=short >"$OUT/tests.log" 2>&1
tail -4 "$OUT/tests.log" | tee -a "$SUMMARY"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20 | tee -a "$SUMMARY"
python3 -c "
import json; rows=[json.loads(l) for l in open('$SPARK_CUDA_REPORT')]
for r in sorted(rows, key=lambda r: -r['max_rel_l2'])[:6]: print('worst: %.3g  %s' % (r['max_rel_l2'], r['check']))
print('%d checks recorded' % len(rows))" 2>&1 | tee -a "$SUMMARY"

if [ "${CUDA_TESTS:-1}" = 1 ]; then
    stamp "tests: tests/py/test_cuda.py (instruments off)"
    SPARK_CUDA_REPORT= PYTHONPATH=tools:tests/py timeout 90 python3 -m pytest -q -p no:cacheprovider -rfE \
        tests/py/test_cuda.py >"$OUT/tests_cuda.log" 2>&1
    tail -2 "$OUT/tests_cuda.log" | tee -a "$SUMMARY"
fi

stamp "graphs with instruments (SPARK_CUDA_VERBOSE, spark-tiny, 40 decode steps)"
python3 -c "
import numpy as np; d = np.zeros((8, 256), np.float32); d[2:6] = np.random.default_rng(1).normal(0, 1, (4, 256))
np.save('/tmp/tiny_dir.npy', d)"
IDS=$(python3 -c "print(','.join(str(i) for i in range(3, 43)))")
for flags in "" "--steer /tmp/tiny_dir.npy --steer-layers 2-5" "--capture /tmp/c.npy --capture-positions all" \
    "--ffn-hist /tmp/f.json" "--timing"; do
    line=$(SPARK_CUDA_VERBOSE=1 timeout 30 "$SPARK" logits models/spark-tiny --ids "$IDS" --mode decode --gpu \
        --out /tmp/v.npy $flags 2>&1 | grep -E "graph captures" | sed 's/spark: CUDA backend: //')
    note "  [${flags:-no instrument}] $line"
done

stamp "bench: spark-tiny, decode 256 tokens x 3 reps per variant"
bench_variants() { # MODEL TAG
    local model=$1 tag=$2
    for v in off steer-add steer-ablate capture-last capture-all ffn phases off; do
        case $v in
            off) f="" ;;
            steer-add) f="--steer $3 --steer-layers $4" ;;
            steer-ablate) f="--steer $3 --steer-layers $4 --steer-mode ablate" ;;
            capture-last) f="--capture /tmp/c.npy" ;;
            capture-all) f="--capture /tmp/c.npy --capture-positions all" ;;
            ffn) f="--ffn-hist /tmp/f.json" ;;
            phases) f="--phases" ;;
        esac
        r=$(timeout 30 "$SPARK" bench "$model" --gpu -p 0 -n 256 -r "$REPS" --json $f 2>"/tmp/bench_${tag}_${v}.err" |
            python3 -c "import json,sys; j=json.loads(sys.stdin.read()); print('%.1f %.1f' % (j['tg_tok_s'], j['tg_tok_s_sd']))")
        note "bench $tag $v: ${r:-FAILED} tok/s (mean sd)"
        [ "$v" = phases ] && sed 's/^/    /' "/tmp/bench_${tag}_${v}.err" | grep -vE "weights|warming" | tee -a "$SUMMARY"
    done
}
REPS=3 bench_variants models/spark-tiny tiny /tmp/tiny_dir.npy 2-5

stamp "bench: 4B shape, $LAYERS layers (waiting for the model)"
for _ in $(seq 150); do [ -f /tmp/m4b.done ] && break; sleep 1; done
tail -2 /tmp/model.log | tee -a "$SUMMARY"
python3 -c "
import numpy as np; d = np.zeros(($LAYERS, 2560), np.float32); d[2:6] = np.random.default_rng(1).normal(0, 1, (4, 2560))
np.save('/tmp/m4b_dir.npy', d)"
REPS=2 bench_variants /tmp/m4b m4b /tmp/m4b_dir.npy 2-5
stamp done

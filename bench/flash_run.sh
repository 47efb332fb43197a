#!/bin/bash
# flash_run.sh — one device call for the prefill attention kernel
# (src/backend/cuda/cuda_flash.cu): build, correctness (4B-shaped 4-layer
# check against the CPU, tests/py/test_cuda.py), then prefill timings on the
# 36-layer 4B-shaped model at 512, 8k, 32k and 128k tokens (bench/flash_bench.c).
# Logs under $OUT (default /tmp/flash-run), summary last.
set -u
OUT=${OUT:-/tmp/flash-run}
. "$(dirname "$0")/device_env.sh"
S=$SUMMARY
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$S"
SHAPE=$SHAPE4B
# (a warm machine may still hold them: reused when the shape and context match)
have() { grep -q "\"num_hidden_layers\": $2," $1/config.json 2>/dev/null && grep -q "\"max_position_embeddings\": $3," $1/config.json; }
rm -f /tmp/models.done
if have /tmp/m4b2 4 4096; then echo "wrote /tmp/m4b2 (kept)" >/tmp/models.log
else timeout 100 python3 bench/cuda_bench_model.py /tmp/m4b2 $SHAPE --layers 4 --max-ctx 4096 >/tmp/models.log 2>&1 & fi
CTX=131584 PROMPTS="512 8192 32512 131072"
if [ "${FLASH_QUICK:-0}" = 1 ]; then # (no time to write the model: bench only if a 36-layer one is there)
    CTX=33000 PROMPTS="512 8192 32512"
    have /tmp/m4b 36 40960 || have /tmp/m4b 36 132000 || PROMPTS=
fi
( if have /tmp/m4b 36 132000 || [ $CTX = 33000 ]; then echo "wrote /tmp/m4b (kept)"; else
  timeout 200 python3 bench/cuda_bench_model.py /tmp/m4b $SHAPE --layers 36 --max-ctx 132000; fi >/tmp/models36.log 2>&1
  echo done >/tmp/models.done ) &

stamp build
if timeout 200 make -j16 BUILD=build-flash NVCCFLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a" build-flash/spark \
    >"$OUT/build.log" 2>&1 &&
    gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -o build-flash/flash_bench bench/flash_bench.c build-flash/libspark.a $LIBS \
        >>"$OUT/build.log" 2>&1; then
    note "build: ok"
else
    note "build: FAILED"; tail -30 "$OUT/build.log"; exit 1
fi
export SPARK_BIN=$PWD/build-flash/spark

stamp "correctness: tests (two processes) + 4B-shaped check, concurrently"
export SPARK_CUDA_REPORT=$OUT/errors.jsonl
: >"$SPARK_CUDA_REPORT"
PYTHONPATH=tools:tests/py timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE -k flash tests/py/test_cuda.py \
    >"$OUT/tests.log" 2>&1 &
PA=$!
PYTHONPATH=tools:tests/py timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE -k "not flash and not kv_ and not tq4 and not device_memory" tests/py/test_cuda.py \
    >"$OUT/tests2.log" 2>&1 &
PB=$!
for _ in $(seq 100); do [ -s /tmp/models.log ] && grep -q "m4b2\|wrote\|GB" /tmp/models.log && break; sleep 1; done
sleep 2
timeout 120 python3 - >"$OUT/check.log" 2>&1 <<'PY'
import os, subprocess, numpy as np
spark = os.environ["SPARK_BIN"]
def run(ids, out, *extra, env=None):
    subprocess.run([spark, "logits", "/tmp/m4b2", "--ids", ",".join(map(str, ids)), "--out", out, "--all", "--ctx", "4096", *extra],
                   check=True, env=dict(os.environ, **(env or {})))
    return np.load(out).astype(np.float64)
def rel(a, b): return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
ids = np.random.default_rng(7).integers(3, 131072, 1500)
cpu = run(ids, "/tmp/c.npy")
for batch in ("512", "96"):
    fl = run(ids, "/tmp/f.npy", "--gpu", "--batch", batch)
    e = rel(fl, cpu)
    print(f"check 4B shape 4 layers (SSSF), 1500 tokens, batch {batch}: flash vs cpu max rel L2 {e.max():.3g} "
          f"(mean {e.mean():.3g}){'  OK' if e.max() <= 1e-3 and np.isfinite(fl).all() else '  FAIL'}", flush=True)
PY
grep -E "^check|Error|error" "$OUT/check.log" | tee -a "$S"
wait $PA $PB
tail -4 "$OUT/tests.log" | tee -a "$S"
tail -4 "$OUT/tests2.log" | tee -a "$S"
python3 -c "
import json; rows=[json.loads(l) for l in open('$SPARK_CUDA_REPORT')]
fl=[r for r in rows if 'flash' in r['check']]
for r in sorted(fl, key=lambda r: r['check']): print(f\"  {r['check']}: {r['max_rel_l2']:.3g}\")
w=max(rows, key=lambda r: r['max_rel_l2']) if rows else None
print(f'errors: {len(rows)} checks recorded; worst {w}')" 2>&1 | tee -a "$S"

stamp "bench: waiting for the 36-layer model"
for _ in $(seq 200); do [ -f /tmp/models.done ] && break; sleep 1; done
tail -1 /tmp/models36.log | tee -a "$S"
stamp bench
nvidia-smi --query-gpu=clocks.sm,clocks.mem --format=csv,noheader | sed 's/^/clocks before: /' | tee -a "$S"
[ -n "$PROMPTS" ] && timeout ${BENCH_S:-150} build-flash/flash_bench /tmp/m4b --ctx $CTX $PROMPTS 2>&1 | tee "$OUT/bench.log" | tee -a "$S"
stamp done

# device_env.sh — what every device script (bench/cuda_*.sh, flash_run.sh)
# needs first on a lent GPU machine; sourced, after the script has set OUT
# (and BIN, when it runs carried binaries):
#   . "$(dirname "$0")/device_env.sh"
# Gives: the repository root as the working directory, $SUMMARY and the
# stamp / note helpers (each line also appended to it), nvcc on PATH and
# $CUDA_HOME, the system libraries that machine lacks unpacked from
# .devdeps/*.deb into /tmp/sysroot (EXTRA_CFLAGS / LDFLAGS / LD_LIBRARY_PATH
# for make and for running), $LIBS to link a bench driver against
# libspark.a, and $SHAPE4B (SPEC §1's 4B dimensions for
# bench/cuda_bench_model.py), probe_copy_bandwidth: the floor's
# denominator, a 2 GiB device-to-device copy timed with torch (one line),
# and for scripts that run carried binaries (BIN): start_models / wait_model
# (the 4-layer and 36-layer 4B shapes written in the background) and
# use_carried_bin (its wheels installed, SPARK_BIN set, or the script stops),
# and carried_start, the opening of such a script (all of the above);
# gpu_tests and memcheck_tiny, the checks such a script ends with.
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
T0=$(date +%s)
SUMMARY=${SUMMARY:-$OUT/summary.txt}
: >"$SUMMARY"
stamp() { echo "== [$(($(date +%s) - T0))s] $*" | tee -a "$SUMMARY"; }
note() { echo "$*" | tee -a "$SUMMARY"; }
export PYTHONUNBUFFERED=1
command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
# BIN packed by bench/cuda_carry.sh (*.xz, runtime .debs, wheels/): unpacked
# into $BIN/bin, which BIN then names, before the .debs below are needed
unpack_carry() {
    mkdir -p "$1/bin" .devdeps
    for f in "$1"/*.xz; do xz -dc "$f" >"$1/bin/$(basename "$f" .xz)" && chmod +x "$1/bin/$(basename "$f" .xz)"; done
    cp "$1"/*.deb .devdeps/ 2>/dev/null
    [ -d "$1/wheels" ] && cp -r "$1/wheels" "$1/bin/"
    [ -f "$1/COMMIT" ] && cp "$1/COMMIT" "$1/bin/"
}
if [ -n "${BIN:-}" ] && ls "$BIN"/*.xz >/dev/null 2>&1; then
    unpack_carry "$BIN"
    BIN=$BIN/bin
fi
# BASE: a second carry (another commit's binaries, for before / after in one
# call), unpacked the same way; its cuda_bench is what a sweep's BIN=base runs
if [ -n "${BASE:-}" ] && ls "$BASE"/*.xz >/dev/null 2>&1; then
    unpack_carry "$BASE"
    BASE=$(readlink -f "$BASE/bin")
fi
SYS=/tmp/sysroot
if [ ! -f /usr/include/pcre2.h ] || [ ! -f /usr/include/cjson/cJSON.h ] || [ ! -f /usr/include/microhttpd.h ]; then
    mkdir -p $SYS
    for f in .devdeps/*.deb; do dpkg -x "$f" $SYS; done
    export EXTRA_CFLAGS="-I$SYS/usr/include"
    export LDFLAGS="-L$SYS/usr/lib/x86_64-linux-gnu"
    export LD_LIBRARY_PATH=$SYS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:$CUDA_HOME/lib64
LIBS="-fopenmp ${LDFLAGS:-} -lpcre2-8 -lcjson -lmicrohttpd -lm -lpthread -L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcublas -lcudart -lstdc++"
SHAPE4B="--hidden 2560 --ff 10240 --heads 16 --kv-heads 4 --head-dim 256 --vocab 131072 --window 512"
probe_copy_bandwidth() {
    timeout 60 python3 - <<'PROBE'
import torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record(); y.copy_(x); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
ts.sort(); t = ts[len(ts) // 2] / 1e3
print(f"probe: d2d copy of 2 GiB: median {t*1e3:.3f} ms = {2 * x.numel() / t / 1e12:.2f} TB/s (read + write)")
PROBE
}

# The 4B shape with 4 layers (/tmp/m4b2, max ctx 4096) and with 36 (/tmp/m4b,
# 40960), written in the background one after the other (log: $OUT/models.log);
# wait_model m4b2|m4b waits up to $2 s (default 300) for one. The markers are
# removed first: a warm machine keeps /tmp, and no model is ready before it
# is rewritten.
start_models() {
    # REUSE_MODELS=1: a second script in the same call keeps the first one's models
    [ -n "${REUSE_MODELS:-}" ] && [ -f /tmp/m4b2.done ] && [ -f /tmp/m4b.done ] && return 0
    rm -f /tmp/m4b2.done /tmp/m4b.done
    ( timeout 120 python3 bench/cuda_bench_model.py /tmp/m4b2 $SHAPE4B --layers 4 --max-ctx 4096 >"$OUT/models.log" 2>&1
      echo done >/tmp/m4b2.done
      [ -n "${SMALL_ONLY:-}" ] && exit 0 # SMALL_ONLY=1: the 4-layer model alone
      timeout 300 python3 bench/cuda_bench_model.py /tmp/m4b $SHAPE4B --layers 36 --max-ctx 40960 >>"$OUT/models.log" 2>&1
      echo done >/tmp/m4b.done ) &
}
wait_model() {
    for _ in $(seq "${2:-300}"); do [ -f "/tmp/$1.done" ] && return 0; sleep 1; done
    note "model $1 not written in time ($(tail -1 "$OUT/models.log" 2>/dev/null))"
    return 1
}
# The opening of a script that runs carried binaries: BIN made absolute, the
# machine and GPU named, the models started, the carried binary checked, the
# floor's bandwidth probed (WHAT, optional: said in the first line; the
# probe's TB/s in CARD_TBS, for cuda_bench --card-tbs).
carried_start() {
    BIN=$(readlink -f "$BIN")
    stamp "start${1:+ ($1)} on $(hostname); binaries of $(cat "$BIN/COMMIT" 2>/dev/null || echo "an unnamed build")"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$SUMMARY"
    start_models
    use_carried_bin
    probe_card
}
# probe_card: the copy probe noted, its TB/s kept in CARD_TBS (for cuda_bench --card-tbs).
probe_card() {
    local probe
    probe=$(probe_copy_bandwidth 2>&1 | tail -1)
    note "$probe"
    CARD_TBS=$(echo "$probe" | sed -n 's/.*= \([0-9.]*\) TB\/s.*/\1/p')
}
# type_flags FMT: spark quantize's flags for a QFMTS entry (q4_k_m: llama.cpp's mix, Q6_K in places)
type_flags() { [ "$1" = q4_k_m ] && echo "--type q4_k --recipe q4_k_m" || echo "--type $1"; }
# sweep_env VARS: a SWEEP entry's settings (VAR=V,...) as words in
# SWEEP_VARS, and in SWEEP_BIN the carry they run: $BASE when BIN=base is
# among them (taken out of SWEEP_VARS), else $BIN.
sweep_env() {
    SWEEP_BIN=$BIN
    SWEEP_VARS=$(echo "$1" | tr ',' ' ')
    if [[ " $SWEEP_VARS " == *" BIN=base "* ]]; then
        SWEEP_BIN=$BASE
        SWEEP_VARS=${SWEEP_VARS/BIN=base/}
    fi
}
# bench_ctx MODEL CTX LABEL VARS ROUND: cuda_bench's prefill / decode / generate
# lines for a CTX-token prefill and BENCH_DECODE (default 128) decoded tokens,
# one note; VARS (sweep_env) set for it.
bench_ctx() {
    local line
    sweep_env "$4"
    line=$(env $SWEEP_VARS timeout 150 "$SWEEP_BIN/cuda_bench" "$1" --ctx $(($2 + 788)) --prefill "$2" \
        --decode "${BENCH_DECODE:-128}" ${CARD_TBS:+--card-tbs $CARD_TBS} 2>&1 | tee -a "$OUT/bench.log" |
        grep -E "^(prefill|decode|generate \(greedy|card)|rror" | tr '\n' ' ')
    note "$(basename "$1") ctx $2 $3 [$4] round $5: $line"
}
# The GPU test files a device script runs after its timings.
GPU_TESTS="tests/py/test_cuda.py tests/py/test_cuda_hooks.py tests/py/test_bench.py tests/py/test_pick.py"
# gpu_tests LOG "FILES" [VAR=V ...]: pytest on FILES in that environment, the
# summary and any failure, error or skip to $SUMMARY.
gpu_tests() {
    local log=$1 files=$2
    shift 2
    env "$@" PYTHONPATH=tools:tests/py timeout 330 python3 -m pytest -q -p no:cacheprovider -rfEs $files >"$log" 2>&1
    tail -3 "$log" | tee -a "$SUMMARY"
    grep -E "^(FAILED|ERROR|SKIPPED)" "$log" | head -20 | tee -a "$SUMMARY"
}
# tests_k EXPR [SECONDS]: test_cuda.py's tests that EXPR selects (pytest -k;
# log $OUT/tests.log), the summary and every failure, error or skip to $SUMMARY.
tests_k() {
    stamp "test_cuda.py -k '$1'"
    PYTHONPATH=tools:tests/py timeout "${2:-330}" python3 -m pytest -q -p no:cacheprovider -rfEs tests/py/test_cuda.py \
        -k "$1" >"$OUT/tests.log" 2>&1
    tail -3 "$OUT/tests.log" | tee -a "$SUMMARY"
    grep -E "^(FAILED|ERROR|SKIPPED)|^E  " "$OUT/tests.log" | head -20 | tee -a "$SUMMARY"
}
# memcheck_tiny LOG [VAR=V ...]: spark-tiny's decode under compute-sanitizer in
# that environment; its status is the sanitizer's.
memcheck_tiny() {
    local log=$1
    shift
    env "$@" timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
        "$SPARK_BIN" logits models/spark-tiny --ids 3,4,5,6,7,8,9,10 --all --mode decode --gpu --out /tmp/s.npy >"$log" 2>&1
}
# The carried wheels installed (each alone, --no-deps: the device has numpy
# and torch) and SPARK_BIN=$BIN/spark, or a note and exit when it does not run.
use_carried_bin() {
    if [ -d "$BIN/wheels" ]; then
        timeout 90 python3 -m pip install -q --no-index --no-deps "$BIN"/wheels/*.whl >"$OUT/pip.log" 2>&1 &&
            note "wheels installed: $(ls "$BIN/wheels" | cut -d- -f1 | tr '\n' ' ')" ||
            note "wheels: not installed ($(tail -1 "$OUT/pip.log"))"
    fi
    export SPARK_BIN=$BIN/spark
    "$SPARK_BIN" --help >/dev/null 2>&1 || { note "carried spark does not run: $(ldd "$SPARK_BIN" | grep 'not found')"; exit 1; }
}

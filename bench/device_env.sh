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
# bench/cuda_bench_model.py), and probe_copy_bandwidth: the floor's
# denominator, a 2 GiB device-to-device copy timed with torch (one line).
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
if [ -n "${BIN:-}" ] && ls "$BIN"/*.xz >/dev/null 2>&1; then
    mkdir -p "$BIN/bin" .devdeps
    for f in "$BIN"/*.xz; do xz -dc "$f" >"$BIN/bin/$(basename "$f" .xz)" && chmod +x "$BIN/bin/$(basename "$f" .xz)"; done
    cp "$BIN"/*.deb .devdeps/ 2>/dev/null
    [ -d "$BIN/wheels" ] && cp -r "$BIN/wheels" "$BIN/bin/"
    BIN=$BIN/bin
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

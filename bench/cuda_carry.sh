#!/bin/bash
# cuda_carry.sh — build the device binaries here and pack them small enough
# to travel with the working tree (the device tool's 64 MiB limit): spark,
# bench/cuda_bench.c and bench/cuda_gemv_bench.cu linked against one build,
# stripped and xz-compressed, plus the runtime .debs the device lacks
# (libpcre2-8, libcjson, libmicrohttpd) and any wheels in $WHEELS.
#
#   bash bench/cuda_carry.sh [BUILD_DIR] [CARRY_DIR]     (defaults build-carry, .carry)
#   ONLY="spark cuda_bench" bash bench/cuda_carry.sh      (only those binaries packed;
#                                   cuda_kv_bench is packed only when named)
#   ONLY=cuda_bench bash bench/cuda_carry.sh build-carry .carry-base
#   (flash_bench: the prefill attention timed alone, bench/flash_bench.c)
#                                   (a BASE carry for cuda_longctx_run.sh: no .debs, no wheels)
#
# The working tree plus the carries must stay under 64 MiB, and the tracked
# files are ~58 MB: a carry of spark + cuda_bench (~5 MB with the .debs) and
# a BASE of cuda_bench alone (~2.5 MB) fit; the probes and gemv bench do not
# fit beside them. A wheel that ships a C extension (pyyaml) travels without
# it (its pure-Python fallback; the wheel's RECORD rewritten), ~0.8 MB less.
#
# Then, on the device (run's `carry`: the CARRY_DIR):
#   BIN=.carry SWEEP=... bash bench/cuda_decode_run.sh quick
# which unpacks it first. Building here saves the device's minutes: a full
# nvcc build there takes ~1.5 of them.
set -eu
cd "$(dirname "$0")/.."
B=${1:-build-carry}
C=${2:-.carry}
# sm_90a code only (no compute_80 PTX): the device is an H200, and the carry must stay small
make -j"$(nproc)" BUILD="$B" NVCCFLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a" "$B/spark" >/dev/null
CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
LIBS="-fopenmp -lpcre2-8 -lcjson -lmicrohttpd -lm -lpthread -L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcublas -lcudart -lstdc++"
PACK=${ONLY:-spark cuda_bench cuda_gemv_bench l2_probe flow_probe}
packs() { [[ " $PACK " == *" $1 "* ]]; } # only what is packed is built
packs cuda_bench && gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -o "$B/cuda_bench" bench/cuda_bench.c "$B/libspark.a" $LIBS
packs flash_bench && gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -o "$B/flash_bench" bench/flash_bench.c "$B/libspark.a" $LIBS
packs cuda_kv_bench && gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o "$B/cuda_kv_bench" bench/cuda_kv_bench.c "$B/libspark.a" $LIBS
packs cuda_gemv_bench && nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
    -o "$B/cuda_gemv_bench" bench/cuda_gemv_bench.cu "$B/libspark.a" -lcublas
packs l2_probe && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o "$B/l2_probe" bench/l2_probe.cu
packs flow_probe && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -o "$B/flow_probe" \
    bench/flow_probe.cu
rm -rf "$C"
mkdir -p "$C"
for f in $PACK; do
    strip -o "$C/$f" "$B/$f"
    xz -9e -T"$(nproc)" "$C/$f"
done
# what the binaries were built from (the device's own checkout need not say:
# device_env.sh's carried_start prints this)
git diff --quiet HEAD -- src include bench || dirty=" + uncommitted changes"
echo "$(git rev-parse --short HEAD)${dirty:-}, built $(date -u +%Y-%m-%dT%H:%MZ)" >"$C/COMMIT"
packs spark || { du -sh "$C"; exit 0; } # a BASE carry: its bench drivers are all it runs
debs=$(ls .devlibs/*.deb 2>/dev/null || true)
if [ -z "$debs" ]; then
    (cd "$C" && apt-get download libpcre2-8-0 libcjson1 libmicrohttpd12 >/dev/null 2>&1) || echo "note: no runtime .debs (apt-get download failed)"
else
    cp $debs "$C/"
fi
# wheel_without_so WHEEL DIR: WHEEL into DIR less its compiled modules, RECORD rewritten
wheel_without_so() {
    local t
    t=$(mktemp -d)
    (cd "$t" && unzip -q "$1" && find . -name '*.so' -delete && python3 - <<'PY'
import base64, glob, hashlib, os, re
# pure Python now, so tagged py3-none-any: the device's Python may not be ours
whl = glob.glob("*.dist-info/WHEEL")[0]
meta = re.sub(r"(?m)^Tag: .*\n", "", open(whl).read()).replace("Root-Is-Purelib: false", "Root-Is-Purelib: true")
open(whl, "w").write(meta.rstrip("\n") + "\nTag: py3-none-any\n")
rec = glob.glob("*.dist-info/RECORD")[0]
rows = []
for root, _, files in os.walk("."):
    for f in files:
        p = os.path.join(root, f)[2:]
        if p != rec:
            d = open(p, "rb").read()
            rows.append(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}")
open(rec, "w").write("\n".join(rows + [rec + ",,"]) + "\n")
PY
    zip -q -r "$2/$(basename "$1" | cut -d- -f1-2)-py3-none-any.whl" .)
    rm -rf "$t"
}
if [ -n "${WHEELS:-}" ]; then
    mkdir -p "$C/wheels"
    for w in "$WHEELS"/*.whl; do
        case $(basename "$w") in
        pyyaml-*) wheel_without_so "$(readlink -f "$w")" "$(readlink -f "$C/wheels")" ;;
        *) cp "$w" "$C/wheels/" ;;
        esac
    done
fi
du -sh "$C"

#!/bin/bash
# cuda_carry.sh — build the device binaries here and pack them small enough
# to travel with the working tree (the device tool's 64 MiB limit): spark,
# bench/cuda_bench.c and bench/cuda_gemv_bench.cu linked against one build,
# stripped and xz-compressed, plus the runtime .debs the device lacks
# (libpcre2-8, libcjson, libmicrohttpd) and any wheels in $WHEELS.
#
#   bash bench/cuda_carry.sh [BUILD_DIR] [CARRY_DIR]     (defaults build-carry, .carry)
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
gcc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -o "$B/cuda_bench" bench/cuda_bench.c "$B/libspark.a" $LIBS
nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -o "$B/cuda_gemv_bench" \
    bench/cuda_gemv_bench.cu "$B/libspark.a" -lcublas
rm -rf "$C"
mkdir -p "$C"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o "$B/l2_probe" bench/l2_probe.cu
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude -o "$B/flow_probe" bench/flow_probe.cu
for f in spark cuda_bench cuda_gemv_bench l2_probe flow_probe; do
    strip -o "$C/$f" "$B/$f"
    xz -9e -T"$(nproc)" "$C/$f"
done
debs=$(ls .devlibs/*.deb 2>/dev/null || true)
if [ -z "$debs" ]; then
    (cd "$C" && apt-get download libpcre2-8-0 libcjson1 libmicrohttpd12 >/dev/null 2>&1) || echo "note: no runtime .debs (apt-get download failed)"
else
    cp $debs "$C/"
fi
if [ -n "${WHEELS:-}" ]; then mkdir -p "$C/wheels" && cp "$WHEELS"/*.whl "$C/wheels/"; fi
du -sh "$C"

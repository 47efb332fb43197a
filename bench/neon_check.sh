#!/bin/sh
# neon_check.sh — build tests/c/test_kernels.c for aarch64 and run it under
# qemu, so the NEON kernels are checked against the scalar path (and the
# float64 references) on an x86 machine.
#
#   sh bench/neon_check.sh            needs gcc-aarch64-linux-gnu (+ qemu-user to run)
#
# Only the self-contained part of the library is linked: the CPU backend, the
# weight formats and quantizers, and the base helpers.
set -eu
cd "$(dirname "$0")/.."
CC=${CC_AARCH64:-aarch64-linux-gnu-gcc}
OUT=${OUT:-/tmp/spark-neon-check}
command -v "$CC" >/dev/null || { echo "neon_check: $CC not found (apt-get install gcc-aarch64-linux-gnu)"; exit 2; }
mkdir -p "$OUT"
EXTRA=""
[ -f src/engine/kv_format.c ] && EXTRA="src/engine/kv_format.c"
FLAGS="-std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -Iinclude -Isrc -Itests/c"
# the test file without the loop vectorizer: aarch64 gcc 12 stops with an
# internal compiler error (vect_transform_reduction) on its float64 checks
"$CC" $FLAGS -fno-tree-vectorize -c -o "$OUT/test_kernels.o" tests/c/test_kernels.c
"$CC" $FLAGS -static -o "$OUT/test_kernels" "$OUT/test_kernels.o" \
    src/backend/cpu/*.c src/model/quant.c src/model/quantize.c src/io/dtype.c src/base/*.c $EXTRA -lm -lpthread
echo "neon_check: built $OUT/test_kernels (aarch64)"
if command -v qemu-aarch64 >/dev/null; then
    qemu-aarch64 "$OUT/test_kernels"
else
    echo "neon_check: qemu-aarch64 not found (apt-get install qemu-user): compiled only"
fi

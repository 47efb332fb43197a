#!/bin/bash
# cuda_quant_check.sh — quantized weights on the GPU against the CPU, per
# code path: a small synthetic model (head_dim 256, GQA 4, window 16) and
# spark-tiny, each quantized to Q8_0 and Q4_K here, checked with
# bench/decode_check.py (prefill, and decode with the fast path, without
# fusion, without the one-launch attention, with the first kernels only).
#
#   BIN=.carry bash bench/cuda_quant_check.sh        (on the device; BIN as cuda_decode_run.sh)
set -u
OUT=${OUT:-/tmp/cuda-quant}
BIN=${BIN:-.carry}
. "$(dirname "$0")/device_env.sh"
export SPARK_BIN=$(readlink -f "$BIN")/spark
PYTHONPATH=tools python3 -c "
import mkmodel
mkmodel.make_model('/tmp/qc-d256', dtype='bf16', hidden=512, ff=1024, layers=4, heads=8, kv_heads=2, head_dim=256,
                   vocab=1024, window=16, pattern='SSSF', seed=4)" >"$OUT/mkmodel.log" 2>&1 || note "mkmodel failed"
VARIANTS="default fuse-off:SPARK_CUDA_FUSE=0 attstep-off:SPARK_CUDA_ATTSTEP=0 first-kernels:SPARK_CUDA_FAST=0 graphs-off:SPARK_CUDA_GRAPH=0"
for src in /tmp/qc-d256:1024:40 models/spark-tiny:6144:24; do
    IFS=: read -r path vocab n <<<"$src"
    for fmt in q8_0 q4_k; do
        "$SPARK_BIN" quantize "$path" /tmp/qc.gguf --type $fmt -q >/dev/null 2>&1
        stamp "$(basename "$path") $fmt"
        timeout 120 python3 bench/decode_check.py /tmp/qc.gguf --tokens "$n" --vocab "$vocab" --prefill $VARIANTS 2>&1 |
            grep -E "^check|FAIL|rror" | tee -a "$SUMMARY"
    done
done
stamp done

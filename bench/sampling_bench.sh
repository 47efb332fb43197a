#!/bin/bash
# sampling_bench.sh — what choosing a token costs beside the forward pass:
# two small models (256 wide, 2 layers) with the real 131072-token
# vocabulary, their tied-head logits' spread set by the embedding's scale
# (std ~4, as tools/mkmodel.py makes them, and ~16), and bench/cuda_bench's
# generate lines (greedy; temperature 1 / 0.5 with top-p 0.95) through the
# host sampler (SPARK_PICK=0) and through the backend's pick / candidates,
# alternating, twice. The forward pass is small, so the differences are the
# sampling path's (bench/cuda_runs.md run 11).
#
#   bash bench/sampling_bench.sh CUDA_BENCH [--cpu]
set -eu
cd "$(dirname "$0")/.."
BENCH=${1:?usage: sampling_bench.sh CUDA_BENCH [--cpu]}
shift
python3 - <<'PY'
import sys
sys.path.insert(0, "tools")
import numpy as np
import mkmodel
for name, scale in (("flat", 1.0), ("peaked", 4.0)):
    cfg = mkmodel.build_config(hidden=256, ff=512, layers=2, heads=2, kv_heads=1, head_dim=128, vocab=131072,
                               window=512, max_ctx=4096, seed=5)
    w = mkmodel.make_weights(cfg, 5, "bf16")
    w["model.embedding.weight"] = (w["model.embedding.weight"] * scale).astype(np.float32)
    mkmodel.write_hf(f"/tmp/sampling-{name}", cfg, w, "bf16")
PY
for round in 1 2; do
    for m in flat peaked; do
        for pick in 0 1; do
            echo "$m SPARK_PICK=$pick: $(SPARK_PICK=$pick timeout 60 "$BENCH" /tmp/sampling-$m --ctx 4096 --prefill 64 \
                --decode 128 "$@" 2>&1 | grep -E "^generate|rror" | sed 's/, [0-9.]* tok\/s.*//' | tr '\n' '|')"
        done
    done
done

#!/bin/bash
# cuda_peer_run.sh — one device call: spark's decode and prefill next to
# llama.cpp's (CUDA) on the same 36-layer 4B-shaped GGUF files, each format
# quantized here by `spark quantize`, the two programs alternating twice.
#
#   BIN=.carry PEER=.carry-peer [FMTS="bf16 q8_0 q4_k q4_k_m"] [TESTK=expr] bash bench/cuda_peer_run.sh
#
# (TESTK: test_cuda.py's tests that -k selects, run first.)
# PEER holds llama-bench.xz: llama.cpp's llama-bench built elsewhere with
# CUDA for sm_90a and linked statically (nothing of llama.cpp is in this
# repository; bench/cuda_runs.md says which build and how). llama.cpp reads a
# copy of each file with tokenizer.ggml.model = "none" added, every tensor
# byte identical (bench/run_cpu_bench.py's llama_copy checks it): it refuses
# a file without a tokenizer key, and llama-bench feeds token ids.
# Both programs are timed at the same depth: spark's cuda_bench decodes 128
# tokens after a 512-token prefill; llama-bench runs tg128 at depth 512
# (-d 512) and pp512, with flash attention and every layer on the GPU.
set -u
OUT=${OUT:-/tmp/cuda-peer}
BIN=${BIN:-.carry}
PEER=$(readlink -f "${PEER:-.carry-peer}")
. "$(dirname "$0")/device_env.sh"
carried_start "spark and llama.cpp on the same files"
[ -n "${TESTK:-}" ] && tests_k "$TESTK" 200 # test_cuda.py's tests selected by TESTK first
LLAMA=/tmp/llama-bench
xz -dc "$PEER/llama-bench.xz" >$LLAMA && chmod +x $LLAMA || { note "no llama-bench in $PEER"; exit 1; }
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$CUDA_HOME/lib:/usr/local/cuda/lib
ldd $LLAMA | grep "not found" | tee -a "$SUMMARY"
note "llama-bench: $(timeout 20 $LLAMA --list-devices 2>&1 | tail -2 | tr '\n' ' ')"

wait_model m4b 300 || exit 1
for fmt in ${FMTS:-bf16 q8_0 q4_k}; do
    stamp "36 layers in $fmt"
    f=/tmp/m4b-$fmt.gguf
    timeout 240 "$SPARK_BIN" quantize /tmp/m4b $f $(type_flags "$fmt") -q 2>&1 | tail -1 | tee -a "$SUMMARY"
    timeout 200 python3 -c "import sys; sys.path.insert(0, 'bench'); from pathlib import Path
from run_cpu_bench import llama_copy; llama_copy(Path('$f'), Path('/tmp/llama-$fmt.gguf'))" 2>&1 | tail -2 | tee -a "$SUMMARY"
    for round in 1 2; do
        line=$(timeout 150 "$BIN/cuda_bench" $f --ctx 1300 --prefill 512 --decode 128 ${CARD_TBS:+--card-tbs $CARD_TBS} 2>&1 |
            tee -a "$OUT/bench.log" | grep -E "^(prefill|decode [0-9]|generate \(greedy|card)|rror" | tr '\n' ' ')
        note "spark $fmt round $round: $line"
        timeout 200 $LLAMA -m /tmp/llama-$fmt.gguf -ngl 99 -fa 1 -p 512 -n 128 -d 0,512 -r 3 -o md \
            >"$OUT/llama-$fmt-$round.md" 2>"$OUT/llama-$fmt-$round.err"
        note "llama.cpp $fmt round $round (rc $?):"
        grep -E "^\|" "$OUT/llama-$fmt-$round.md" | tee -a "$SUMMARY"
        grep -v "^ggml_cuda_init\|^  Device\|^$" "$OUT/llama-$fmt-$round.err" | tail -3 | tee -a "$SUMMARY"
    done
    rm -f $f /tmp/llama-$fmt.gguf
done
stamp "done"

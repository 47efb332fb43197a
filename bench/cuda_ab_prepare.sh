#!/bin/bash
# cuda_ab_prepare.sh — the two carries of a before / after comparison on the
# device, built here from HEAD and HEAD + a patch, so the device call spends
# its minutes measuring:
#
#   bash bench/cuda_ab_prepare.sh bench/pending/NAME.patch
#
#   .carry-base  HEAD's cuda_bench alone (cuda_carry.sh's BASE carry)
#   .carry       HEAD + the patch (applied in a scratch worktree): spark and
#                cuda_bench, the runtime .debs, and the wheels in .whl (gguf
#                and pyyaml, downloaded when .whl has none)
#
# Then one device call with carry [".carry", ".carry-base"], e.g.
#   BIN=.carry BASE=.carry-base SWEEP="base:BIN=base;new:" CTX=512 \
#     PREFILL_CHECK=1 QFMTS="q8_0 q4_k" TESTS=1 bash bench/cuda_longctx_run.sh
# The scripts that run there are HEAD's (the working tree that travels); only
# the binaries in .carry carry the patch. A patch kept in bench/pending/
# survives a session that ends before it is measured, where a branch may not.
set -eu
cd "$(dirname "$0")/.."
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: bash bench/cuda_ab_prepare.sh PATCH" >&2; exit 2; }
PATCH=$(readlink -f "$1")
ROOT=$PWD
git apply --check "$PATCH" || { echo "cuda_ab_prepare: $1 does not apply to HEAD" >&2; exit 1; }
if ! ls .whl/gguf-*.whl .whl/pyyaml-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps -d .whl gguf pyyaml
fi
ONLY=cuda_bench bash bench/cuda_carry.sh build-carry-base .carry-base
W=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$W/ab" 2>/dev/null || true; rm -rf "$W"' EXIT
git worktree add -q --detach "$W/ab" HEAD
git -C "$W/ab" apply "$PATCH"
(cd "$W/ab" && ONLY="spark cuda_bench" WHEELS="$ROOT/.whl" bash bench/cuda_carry.sh build-carry "$ROOT/.carry")
echo "cuda_ab_prepare: .carry = HEAD $(git rev-parse --short HEAD) + $(basename "$PATCH"); .carry-base = HEAD"

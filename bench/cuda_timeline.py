#!/usr/bin/env python3
"""Read a SPARK_CUDA_TIMELINE file: where a decode step's time goes at its kernel boundaries.

    SPARK_CUDA_TIMELINE=/tmp/tl.jsonl spark run MODEL --gpu -n 64 ...
    python3 bench/cuda_timeline.py /tmp/tl.jsonl [--layers]

The file has one line per fused GEMV / one-launch attention of the last
decode step the backend replayed, each with every block's [entry, end of
the dependency wait, exit] in %globaltimer ns (cuda_graph.cu). For each
launch, against the launch before it in the step:

  resident   how long before the predecessor's last block exited this
             launch's first block had entered (its weight loads issued
             before the wait run in that time; negative: it entered after)
  late       this launch's blocks that entered only after the predecessor
             ended, of all its blocks
  release    predecessor's exit -> this launch's first block past its wait
  spread     first -> last block past the wait
  span       predecessor's exit -> this launch's exit: its share of the step
  TB/s       GEMVs: weight bytes / (first block past its wait -> exit)

and per kind (median over the layers), then the step's sum of spans. For
the one-launch attention also its phases, per block from its wait (marks 3-7
of cuda_attn_step.cu; medians over blocks, then over launches): q / gate
loads, rope and the owner's store; the key tiles; the warps' merge; the
cluster barrier; the merge through distributed shared memory; the last
cluster barrier. For the fused GEMVs, per block from its wait (mark 3 of
cuda_fgemv.cu): the prologue (x loaded, normalised, for Q8_0 / Q4_K rounded
to int16), then the products and writes of the block's row groups.
"""
import argparse
import json
import statistics
import sys


PHASES = [("q_rope_us", 1, 3), ("tiles_us", 3, 4), ("warp_merge_us", 4, 5), ("cl_sync_us", 5, 6),
          ("dsmem_merge_us", 6, 7), ("last_bar_us", 7, 2)]
# a fused GEMV's (cuda_fgemv.cu: mark 3, x ready)
GEMV_PHASES = [("prologue_us", 1, 3), ("products_us", 3, 2)]


def kind_of(r):
    if r["op"] == "attn":
        return "attention" + (" (sliding)" if r["window"] else " (full)")
    if r["pair"]:
        return "ffn gate/up (norm, pair)"
    if r["norm"] and r["rows1"]:
        return "qkv + gate (norm)"
    if r["norm"]:
        return "head (norm)"
    if r["resid"] and r["cols"] > 5000:
        return "ffn down (+resid)"
    if r["resid"]:
        return "out proj (+resid)"
    return "gemv"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--layers", action="store_true", help="print every launch, not only the medians")
    args = ap.parse_args()
    rows = [json.loads(l) for l in open(args.file) if l.strip()]
    if not rows:
        sys.exit(f"{args.file}: no launches recorded")
    per_kind = {}
    prev = None
    total = 0.0
    for r in rows:
        b = r["blocks"]
        if not b:
            continue
        entry = min(x[0] for x in b)
        waited = sorted(x[1] for x in b)
        end = max(x[2] for x in b)
        k = kind_of(r)
        d = {"blocks": len(b)}
        if prev is not None:
            pend = prev["end"]
            d["resident_us"] = (pend - entry) / 1e3
            d["late"] = sum(1 for x in b if x[0] > pend) / len(b)
            d["release_us"] = (waited[0] - pend) / 1e3
            d["span_us"] = (end - pend) / 1e3
            total += d["span_us"]
        d["spread_us"] = (waited[-1] - waited[0]) / 1e3
        d["busy_us"] = (end - waited[0]) / 1e3
        if r["op"] == "fgemv":
            rows_all = r["rows0"] * (2 if r["pair"] else 1) + (0 if r["pair"] else r["rows1"])
            d["tb_s"] = rows_all * r["row_bytes"] / max(end - waited[0], 1) / 1e3
        if r["op"] == "attn" and len(b[0]) >= 8 and all(x[3] for x in b):
            for name, m0, m1 in PHASES:
                d[name] = statistics.median(x[m1] - x[m0] for x in b) / 1e3
            # the block the cluster barrier waits for: the latest to reach it, against the median
            arrive = [x[5] - x[1] for x in b]
            d["skew_us"] = (max(arrive) - statistics.median(arrive)) / 1e3
            d["slowest_block"] = arrive.index(max(arrive))
        if r["op"] == "fgemv" and len(b[0]) >= 4 and all(x[3] for x in b):
            for name, m0, m1 in GEMV_PHASES:
                d[name] = statistics.median(x[m1] - x[m0] for x in b) / 1e3
        per_kind.setdefault(k, []).append(d)
        if args.layers:
            print(f"{r['launch']:4d} {k:26s} " + " ".join(f"{n}={v:.3f}" if isinstance(v, float) else f"{n}={v}"
                                                        for n, v in d.items()))
        prev = {"end": end}
    cols = ["blocks", "resident_us", "late", "release_us", "spread_us", "busy_us", "span_us", "tb_s"]
    print(f"{'kind (median over launches)':30s} {'n':>4s} " + " ".join(f"{c:>11s}" for c in cols))
    for k, ds in per_kind.items():
        vals = []
        for c in cols:
            xs = [d[c] for d in ds if c in d]
            vals.append(f"{statistics.median(xs):11.3f}" if xs else f"{'':>11s}")
        print(f"{k:30s} {len(ds):4d} " + " ".join(vals))
    print(f"step: {len(rows)} launches, sum of spans {total:.1f} us (from the first launch's exit)")
    for k, ds in per_kind.items():
        if "prologue_us" in ds[0]:
            print(f"{k} phases (us, per block from its wait): " +
                  ", ".join(f"{n[:-3]} {statistics.median(d[n] for d in ds):.3f}" for n, _, _ in GEMV_PHASES))
        if "tiles_us" in ds[0]:
            print(f"{k} phases (us, per block from its wait): " +
                  ", ".join(f"{n[:-3]} {statistics.median(d[n] for d in ds):.3f}" for n, _, _ in PHASES) +
                  f"; the last block at the cluster barrier {statistics.median(d['skew_us'] for d in ds):.3f} us "
                  f"after the median one (blocks {sorted(set(d['slowest_block'] for d in ds))[:8]})")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""KV-cache format quality on a trained model: held-out perplexity and the
KL divergence of every next-token distribution from the exact (f32) cache.

For each window of --ctx tokens of the held-out text (non-overlapping, as
`spark perplexity --stride CTX` cuts them) and each cache format, runs
`spark logits --all` and scores in float64:
    nll      = logsumexp(logits[t]) - logits[t][ids[t+1]]   (positions 0..n-2)
    KL       = sum_v p_f32(v) (log p_f32(v) - log p_fmt(v))  per position, averaged
    top-1    = fraction of positions whose argmax equals the f32 cache's
Perplexity is exp(mean nll) over every scored position of every window, the
number `spark perplexity --ctx CTX --stride CTX --chunks W` prints.

    python3 bench/kv_quality.py --spark build/spark --model models/spark-tiny \
        --file models/spark-tiny/heldout.txt --ctx 2048 --windows 12 [--json out.json]
Prints a Markdown table.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# (label, flags); the first is the reference every KL is measured against
CONFIGS = [
    ("f32", []),
    ("f16", ["--kv-type", "f16"]),
    ("bf16", ["--kv-type", "bf16"]),
    ("tq4 full", ["--kv-bits", "4"]),
    ("tq3.5 full", ["--kv-bits", "3.5"]),
    ("tq3 full", ["--kv-bits", "3"]),
    ("tq2 full", ["--kv-bits", "2"]),
    ("tq4 all", ["--kv-bits", "4", "--kv-layers", "all"]),
    ("tq3.5 all", ["--kv-bits", "3.5", "--kv-layers", "all"]),
    ("tq3 all", ["--kv-bits", "3", "--kv-layers", "all"]),
    ("tq2 all", ["--kv-bits", "2", "--kv-layers", "all"]),
]


def tokenize(spark, model, path):
    out = subprocess.run([spark, "tokenize", model, "--input", path, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def run_logits(spark, model, ids, ctx, flags, threads, tmp):
    out = Path(tmp) / "logits.npy"
    cmd = [spark, "logits", model, "--ids", ",".join(map(str, ids)), "--out", str(out), "--all",
           "--ctx", str(ctx)] + flags
    if threads:
        cmd += ["-t", str(threads)]
    subprocess.run(cmd, check=True, capture_output=True)
    return np.load(out)


def kv_bytes(spark, model, ctx):
    """Per-format KV bytes per position and sliding-ring bytes, from spark inspect --json."""
    info = json.loads(subprocess.run([spark, "inspect", model, "--json", "--ctx", str(ctx)], check=True,
                                     capture_output=True, text=True).stdout)
    return {(f["type"], f["layers"]): f for f in info["kv_formats"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spark", default="build/spark")
    ap.add_argument("--model", default="models/spark-tiny")
    ap.add_argument("--file", default="models/spark-tiny/heldout.txt")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    ids = tokenize(args.spark, args.model, args.file)
    n_win = min(args.windows, (len(ids) - 1) // args.ctx)
    stats = {label: {"nll": 0.0, "kl": 0.0, "kl_max": 0.0, "top1": 0, "n": 0} for label, _ in CONFIGS}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for w in range(n_win):
            win = ids[w * args.ctx:(w + 1) * args.ctx]
            ref = None
            for label, flags in CONFIGS:
                lp = log_softmax(run_logits(args.spark, args.model, win, args.ctx, flags, args.threads, tmp))[:-1]
                s = stats[label]
                s["nll"] += float(-lp[np.arange(len(win) - 1), win[1:]].sum())
                s["n"] += len(win) - 1
                if ref is None:
                    ref = lp
                kl = (np.exp(ref) * (ref - lp)).sum(axis=1)
                s["kl"] += float(kl.sum())
                s["kl_max"] = max(s["kl_max"], float(kl.max()))
                s["top1"] += int((lp.argmax(axis=1) == ref.argmax(axis=1)).sum())
            print(f"window {w + 1}/{n_win} done ({time.time() - t0:.0f} s)", file=sys.stderr)

    sizes = kv_bytes(args.spark, args.model, args.ctx)
    base_ppl = float(np.exp(stats["f32"]["nll"] / stats["f32"]["n"]))
    rows = []
    for label, flags in CONFIGS:
        s = stats[label]
        name = label.split()[0]
        layers = label.split()[1] if " " in label else "all"
        f = sizes.get((name, layers))
        ppl = float(np.exp(s["nll"] / s["n"]))
        rows.append(dict(config=label, ppl=ppl, dppl_pct=100 * (ppl / base_ppl - 1), kl=s["kl"] / s["n"],
                         kl_max=s["kl_max"], top1=s["top1"] / s["n"], positions=s["n"],
                         kv_bytes_per_token=f["bytes_per_token"] if f else None,
                         kv_bytes_context=f["bytes_at_context"] if f else None))
    print(f"| KV cache | bits/value (full layers) | KV bytes/position | KV at ctx {args.ctx} | perplexity | "
          f"vs f32 | mean KL vs f32 (nats) | max KL | top-1 = f32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        bits = {"f32": 32, "f16": 16, "bf16": 16}.get(r["config"].split()[0])
        bits = bits if bits else r["config"].split()[0][2:]
        print(f"| {r['config']} | {bits} | {r['kv_bytes_per_token']} | {r['kv_bytes_context'] / 1e6:.2f} MB | "
              f"{r['ppl']:.4f} | {r['dppl_pct']:+.3f}% | {r['kl']:.2e} | {r['kl_max']:.2e} | {100 * r['top1']:.2f}% |")
    print(f"\n{n_win} windows of {args.ctx} tokens, {rows[0]['positions']} scored positions; "
          f"{time.time() - t0:.0f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

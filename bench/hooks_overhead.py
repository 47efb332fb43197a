#!/usr/bin/env python3
"""Decode-time cost of each instrument (issue 8), on models/spark-tiny.

Runs `spark run` greedily for N tokens with each hook off and on, several
times each, interleaved, and reports the median generation tok/s and the
overhead against the no-hook run. A benchmark, not a test: numbers go to
bench/RESULTS.md by hand with the date and the machine's load.

    python3 bench/hooks_overhead.py [--bin build/spark] [-n 128] [--reps 5]
"""
import argparse
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "spark-tiny"


def tok_s(binary, extra, n):
    out = subprocess.run([binary, "run", "-m", MODEL, "-p", "And God said,", "-n", str(n), "--temp", "0", "--ignore-eos",
                          "-t", "1", *extra], capture_output=True, text=True, check=True)
    return float(re.search(r"generated: \d+ tokens, ([\d.]+) tok/s", out.stderr).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build" / "spark"))
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    d = np.zeros((8, 256), np.float32)
    d[4:] = np.random.default_rng(0).normal(0, 1, (4, 256))
    np.save(tmp / "dir.npy", d)
    configs = {
        "off": [],
        "steering (4 layers, add)": ["--steer", tmp / "dir.npy", "--steer-strength", "0.5"],
        "phase timing": ["--timing"],
        "capture (all layers, all positions)": ["--capture", tmp / "c.npy", "--capture-positions", "all"],
        "FFN statistics (top-32)": ["--ffn-hist", tmp / "f.json"],
    }
    runs = {k: [] for k in configs}
    for _ in range(a.reps):
        for k, extra in configs.items():
            runs[k].append(tok_s(a.bin, [str(x) for x in extra], a.n))
    base = statistics.median(runs["off"])
    print(f"| instrument | decode tok/s (median of {a.reps}) | overhead |")
    print("|---|---|---|")
    for k, v in runs.items():
        m = statistics.median(v)
        print(f"| {k} | {m:.1f} | {100 * (base / m - 1):+.1f} % |")


if __name__ == "__main__":
    main()

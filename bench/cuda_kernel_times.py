#!/usr/bin/env python3
"""cuda_kernel_times.py — Nsight Compute's per-kernel durations summed by name.

    ncu --metrics gpu__time_duration.sum --csv --print-units base PROGRAM ... > FILE.csv
    python3 bench/cuda_kernel_times.py FILE.csv [--tokens N] [--top K]

Prints each kernel name (templates shortened) with its launch count, total
time and share of the summed time, largest first; with --tokens the total as
tokens/s. ncu serialises the kernels, so the sum is the device's busy time
without the overlap the program would have had.
"""
import argparse
import csv
import re
import sys
from collections import defaultdict


def short_name(name):
    """The kernel's name without its argument list, templates cut at 70 characters."""
    name = name.split("(")[0] if not name.startswith("void ") else name[5:].split("(")[0]
    return name if len(name) <= 70 else name[:67] + "..."


def read_rows(path):
    with open(path, newline="", errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]
    if not lines:
        sys.exit(f"cuda_kernel_times: {path}: no CSV rows (ncu's output has none: see its .err file)")
    return list(csv.DictReader(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    total_ns = defaultdict(float)
    count = defaultdict(int)
    for row in read_rows(args.csv):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(re.sub(r"[^0-9.eE+-]", "", row["Metric Value"]) or 0)
        unit = row.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
        name = short_name(row["Kernel Name"])
        total_ns[name] += value * scale
        count[name] += 1
    grand = sum(total_ns.values())
    print(f"kernels: {sum(count.values())} launches, {grand / 1e6:.3f} ms summed"
          + (f" = {args.tokens / (grand / 1e9):.0f} tok/s for {args.tokens} tokens" if args.tokens and grand else ""))
    for name, ns in sorted(total_ns.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {ns / 1e6:9.3f} ms {100 * ns / grand:5.1f} %  x{count[name]:<5d} {name}")


if __name__ == "__main__":
    main()

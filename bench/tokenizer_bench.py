#!/usr/bin/env python3
"""Encode throughput of spark's tokenizer next to HF `tokenizers`, same text,
same run.

Text: a few MB of mixed text — half natural multilingual text from files on
this machine (gettext catalogs, man pages, docs, C headers; the sources of
tools/make_tokenizer_fixture.py), half the generated test corpus
(tests/py/tok_corpus.py: code, CJK, kana, Arabic, Hindi, emoji, digits,
whitespace, punctuation, added-token text).

Measured, best of --repeat runs, tokenizer loading excluded:
  spark        `spark tokenize MODEL --input FILE --time` (one thread)
  hf encode    Tokenizer.encode(whole text) (one call, one thread)
  hf batch     Tokenizer.encode_batch(lines) (all cores: rayon)
and ids of spark and of `hf encode` are compared.

Usage: python3 bench/tokenizer_bench.py [--spark build/spark] [--model DIR] [--mb 4] [--repeat 3]
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "py"))
sys.path.insert(0, str(ROOT / "tools"))


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def make_text(mb, added):
    from make_tokenizer_fixture import gather
    from tok_corpus import make_corpus

    half = int(mb * 1e6 / 2)
    natural, size = [], 0
    import contextlib
    import io
    with contextlib.redirect_stderr(io.StringIO()):
        parts = gather(half * 1.2)
    for p in parts:
        natural.append(p)
        size += len(p.encode())
        if size >= half:
            break
    gen, size, seed = [], 0, 0
    while size < half:
        for s in make_corpus(5000, seed=seed, added=added):
            gen.append(s)
            size += len(s.encode())
        seed += 1
    return "".join(natural)[: half] + "\n".join(gen)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spark", default=str(ROOT / "build" / "spark"))
    ap.add_argument("--model", default=str(ROOT.parent / "shared" / "tokenizers" / "spark-x2.5"))
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from tokenizers import Tokenizer

    model = Path(args.model)
    oracle = model / "tokenizer.hf.json" if (model / "tokenizer.hf.json").exists() else model / "tokenizer.json"
    added = [a["content"] for a in json.load(open(oracle, encoding="utf-8"))["added_tokens"]]
    text = make_text(args.mb, added)
    data = text.encode("utf-8")
    hf = Tokenizer.from_file(str(oracle))
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(data)
        path = f.name
    try:
        spark_s, spark_n = [], None
        for _ in range(args.repeat):
            p = subprocess.run([args.spark, "tokenize", str(model), "--input", path, "--time", "--json"],
                               capture_output=True, text=True, check=True)
            spark_s.append(float(re.search(r"in ([0-9.]+) s", p.stderr).group(1)))
            spark_ids = json.loads(p.stdout)
        hf_s, hf_ids = [], None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            hf_ids = hf.encode(text).ids
            hf_s.append(time.perf_counter() - t0)
        lines = text.split("\n")
        batch_s = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            hf.encode_batch(lines)
            batch_s.append(time.perf_counter() - t0)
    finally:
        os.unlink(path)
    mb = len(data) / 1e6
    rows = [("spark (1 thread)", min(spark_s)), ("HF tokenizers encode (1 thread)", min(hf_s)),
            (f"HF tokenizers encode_batch ({os.cpu_count()} cores)", min(batch_s))]
    print(f"date: {time.strftime('%Y-%m-%d')}  CPU: {cpu_name()} ({os.cpu_count()} cores)")
    print(f"text: {mb:.2f} MB mixed, {len(hf_ids)} ids; tokenizer {model}")
    print(f"ids identical (spark vs HF encode): {spark_ids == hf_ids}")
    for name, s in rows:
        print(f"  {name:<40} {s:7.3f} s  {mb / s:7.2f} MB/s")
    print(f"  speed-up over HF encode: {min(hf_s) / min(spark_s):.1f}x")


if __name__ == "__main__":
    main()

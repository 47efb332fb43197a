#!/usr/bin/env python3
"""Quality of `spark quantize` output against its bf16 source.

    python3 bench/quant_quality.py [--spark build/spark] [--tokens 1024] [--record bench/RESULTS.md]

For models/spark-tiny (trained; scored on its held-out text) and a seeded
synthetic model (random weights, random ids), each type is made with
`spark quantize` and compared with the bf16 logits position by position:
mean and max KL(bf16 || quantized), top-1 agreement, and (spark-tiny)
perplexity of the held-out text through `spark perplexity`.
"""
import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

TYPES = ["q8_0", "q6_k", "q4_k_m", "q4_k", "q4_0"]
PPL_WINDOWS = 40  # 40 x 256 tokens of the held-out text


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, **kw)


def logits(spark, model, ids, tmp):
    out = Path(tmp) / "l.npy"
    run([spark, "logits", model, "--ids", ",".join(map(str, ids)), "--out", out, "--all"])
    return np.load(out).astype(np.float64)


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def compare(base, got):
    p, q = log_softmax(base), log_softmax(got)
    kl = (np.exp(p) * (p - q)).sum(-1)
    return float(kl.mean()), float(kl.max()), float((base.argmax(-1) == got.argmax(-1)).mean())


def perplexity(spark, model, text):
    out = run([spark, "perplexity", model, "--file", text, "--ctx", "256", "--chunks", str(PPL_WINDOWS), "--json"]).stdout
    return json.loads(out).get("ppl")


def evaluate(spark, name, src, ids, tmp, text=None):
    rows = []
    base = logits(spark, src, ids, tmp)
    ppl0 = perplexity(spark, src, text) if text else None
    size = sum(f.stat().st_size for f in Path(src).glob("*.safetensors")) if Path(src).is_dir() else Path(src).stat().st_size
    rows.append((name, "bf16 (source)", size, 0, 0, 1, ppl0))
    for t in TYPES:
        out = Path(tmp) / f"{name}-{t}.gguf"
        flag = ["--recipe", "q4_k_m"] if t == "q4_k_m" else ["--type", t]
        run([spark, "quantize", src, out, *flag, "-q"])
        kl, klmax, top1 = compare(base, logits(spark, out, ids, tmp))
        rows.append((name, t, out.stat().st_size, kl, klmax, top1, perplexity(spark, out, text) if text else None))
    return rows


def tiny_ids(spark, n):
    model = ROOT / "models" / "spark-tiny"
    text = model / "heldout.txt"
    ids = json.loads(run([spark, "tokenize", model, "--input", text, "--json"]).stdout)
    return model, text, ids[:n]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spark", default=str(ROOT / "build" / "spark"))
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--record")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if (ROOT / "models" / "spark-tiny" / "model.safetensors").exists():
            model, text, ids = tiny_ids(a.spark, a.tokens)
            rows += evaluate(a.spark, "spark-tiny", model, ids, tmp, text)
        import mkmodel
        syn = Path(tmp) / "synthetic"
        mkmodel.make_model(str(syn), hidden=256, ff=512, layers=4, heads=4, kv_heads=1, head_dim=64, vocab=512,
                           window=8, dtype="bf16", seed=7)
        ids = [int(i) for i in np.random.default_rng(5).integers(0, 512, 256)]
        rows += evaluate(a.spark, "synthetic", syn, ids, tmp)
    lines = [f"## Quantization quality ({datetime.date.today().isoformat()})", "",
             f"`python3 bench/quant_quality.py`: every type made by `spark quantize` from the bf16 source; "
             f"KL(bf16 || quantized) and top-1 agreement over {a.tokens} positions of spark-tiny's held-out "
             f"text and 256 random ids for the synthetic model (4 layers, hidden 256, random weights: "
             f"noise is amplified ~8x into the logits, so its numbers are pessimistic); perplexity "
             f"of the first {PPL_WINDOWS} 256-token windows of the held-out text. Q4_K_M recipe: see src/model/quantize_file.c.", "",
             "| model | type | file | mean KL | max KL | top-1 | perplexity |", "|---|---|---|---|---|---|---|"]
    for name, t, size, kl, klmax, top1, ppl in rows:
        size_s = f"{size / 2**20:.1f} MiB" if size else "-"
        ppl_s = f"{ppl:.3f}" if ppl else "-"
        lines.append(f"| {name} | {t} | {size_s} | {kl:.5f} | {klmax:.4f} | {top1:.3f} | {ppl_s} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.record:
        with open(a.record, "a", encoding="utf-8") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()

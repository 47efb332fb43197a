"""Decode on the GPU against the CPU, per environment variant: the check every
device script (bench/cuda_*.sh) runs before it times anything.

    SPARK_BIN=build/spark python3 bench/decode_check.py MODEL [--tokens 600] [--vocab V] [--prefill] \\
        NAME[:VAR=V,VAR2=V2] ...

For MODEL and a fixed draw of --tokens ids: the CPU's logits at every
position (prefill), then per variant `spark logits --mode decode --gpu` with
the variant's environment, and one line each:

    check decode NAME: vs cpu max rel L2 X (mean Y)[; vs gpu prefill Z]  OK|FAIL

OK when the worst position's relative L2 is <= 1e-3 (the issue's budget for
f32-accumulated bf16) and every logit is finite; a variant that does not run
prints `FAILED to run`. --prefill also checks the GPU's prefill against the
CPU and compares each decode with it. --device cpu runs the "GPU" side on the
CPU instead (a self-test of this script where no GPU is).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np


def rel(a, b):
    return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("variants", nargs="+", help="NAME or NAME:VAR=V,VAR2=V2")
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--vocab", type=int, default=131072, help="ids are drawn from [3, vocab) (the 4B's by default)")
    ap.add_argument("--prefill", action="store_true")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    args = ap.parse_args()
    spark = os.environ.get("SPARK_BIN", "build/spark")
    ids = ",".join(str(i) for i in np.random.default_rng(5).integers(3, args.vocab, args.tokens))
    tmp = tempfile.mkdtemp(prefix="decode_check.")
    device = ["--gpu"] if args.device == "gpu" else []

    def run(name, *extra, env=None):
        out = os.path.join(tmp, name + ".npy")
        subprocess.run([spark, "logits", args.model, "--ids", ids, "--out", out, "--all", *extra], check=True,
                       env=dict(os.environ, SPARK_CUDA_VERBOSE="1", **(env or {})))
        return np.load(out).astype(np.float64)

    cpu = run("cpu")
    pre = None
    if args.prefill:
        pre = run("prefill", *device)
        print(f"check prefill gpu vs cpu: max rel L2 {rel(pre, cpu).max():.3g}", flush=True)
    for v in args.variants:
        name, _, spec = v.partition(":")
        env = dict(kv.split("=", 1) for kv in spec.split(",") if kv)
        try:
            dec = run("decode", "--mode", "decode", *device, env=env)
        except Exception as ex:  # a variant that does not run is reported, the others still are
            print(f"check decode {name}: FAILED to run: {ex}", flush=True)
            continue
        e = rel(dec, cpu)
        vs_pre = f"; vs gpu prefill {rel(dec, pre).max():.3g}" if pre is not None else ""
        ok = e.max() <= 1e-3 and np.isfinite(dec).all()
        print(f"check decode {name}: vs cpu max rel L2 {e.max():.3g} (mean {e.mean():.3g}){vs_pre}"
              f"{'  OK' if ok else '  FAIL'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

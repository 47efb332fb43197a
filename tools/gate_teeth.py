#!/usr/bin/env python3
"""How sharp is the spark-tiny quality gate? Runs the correct build and the
deliberately broken builds (src/engine/mutants.h, made by `make gate-teeth`)
on models/spark-tiny and reports, for each, the held-out perplexity change
and how many of the three greedy continuations (64 tokens) still match the
PyTorch reference stored in models/spark-tiny/reference.json.

    python3 tools/gate_teeth.py [--build build] [--chunks 8] [--out bench/GATE_TEETH.md]
"""
import argparse
import datetime
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "spark-tiny"
MUTANTS = {0: "correct", 1: "rope_swap", 2: "gate_after_out", 3: "window_off_by_one", 4: "tanh_gelu"}
# what catches each mutant when the gate cannot (tests that assert it directly)
DIRECT_TESTS = {
    1: "tests/c/test_engine.c test_rope_per_layer_class; tests/py/test_forward.py test_rope_class_swap_must_matter",
    2: "tests/py/test_forward.py (logits vs tools/ref.py on synthetic models)",
    3: "tests/c/test_engine.c test_rope_per_layer_class (ring = window slots) and the window predicate tests; "
       "tests/py/test_forward.py (10 of 18 fail)",
    4: "tests/py/test_forward.py (10 of 18 fail); tests/c/test_engine.c test_gelu_is_erf_not_tanh (the kernel)",
}


def spark(binary, *args):
    out = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, check=True)
    return out.stdout


def measure(binary, chunks, reference):
    ppl = json.loads(spark(binary, "perplexity", MODEL, "--file", MODEL / "heldout.txt", "--chunks", chunks,
                           "--json"))["ppl"]
    same = 0
    first_diff = []
    for case in reference["greedy"]:
        want = spark(binary, "detokenize", MODEL, "--ids", ",".join(map(str, case["greedy_ids"])))
        got = spark(binary, "run", "-m", MODEL, "-p", case["prompt"], "-n", len(case["greedy_ids"]), "--temp", "0")
        want, got = want.rstrip("\n"), got.rstrip("\n")
        same += got == want
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        first_diff.append(k if got != want else None)
    return ppl, same, first_diff


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--out")
    a = ap.parse_args()
    reference = json.loads((MODEL / "reference.json").read_text())
    rows = []
    base = None
    for n, name in MUTANTS.items():
        binary = ROOT / (a.build if n == 0 else f"build-mutant-{n}") / "spark"
        ppl, same, diffs = measure(binary, a.chunks, reference)
        base = base if base is not None else ppl
        change = 100 * (ppl - base) / base
        seen = n == 0 or abs(change) > 0.5 or same < 3
        rows.append(f"| {name} | {ppl:.4f} | {change:+.3f} % | {same}/3 | {diffs} | "
                    f"{'yes' if seen or n == 0 else 'NO'} | {DIRECT_TESTS.get(n, '')} |")
        print(rows[-1], flush=True)
    head = [f"# Quality-gate teeth ({datetime.date.today()})", "",
            f"spark-tiny, held-out perplexity over the first {a.chunks} windows of 512 tokens "
            f"(reference subset ppl {reference['heldout']['subset']['ppl']:.4f}), and greedy continuations of the "
            "three stored prompts vs PyTorch. 'Gate sees it' = perplexity moves > 0.5 % or a greedy text differs.",
            "", "| variant | ppl | change | greedy same | first differing char | gate sees it | caught directly by |",
            "|---|---|---|---|---|---|---|"]
    text = "\n".join(head + rows) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()

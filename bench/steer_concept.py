#!/usr/bin/env python3
"""Does a steering vector from `spark steer-extract` move spark-tiny's text
toward its concept? (issue 8)

Positive prompts speak of the sea; negative ones of other things. The
extracted direction is added (mode add) at the middle layers, and the share
of sea words in sampled continuations is compared with and without it, over
the same seeds and prompts.

    python3 bench/steer_concept.py [--bin build/spark] [--samples 24] [--strength 4]
"""
import argparse
import re
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "spark-tiny"
POSITIVE = ["the sea and the waves thereof", "ships upon the waters of the great sea",
            "the fishermen cast their nets into the sea", "the waves of the sea roared",
            "they went down to the sea in ships", "the waters of the sea and the deep",
            "the mariners were afraid upon the sea", "a great tempest in the sea"]
NEGATIVE = ["the fields and the vineyards of the land", "the king sat upon his throne",
            "the priests offered sacrifices in the temple", "bread and wine upon the table",
            "the shepherds kept their flocks by night", "the city and the gates thereof",
            "the mountains and the hills", "gold and silver and precious stones"]
SEA = {"sea", "seas", "ship", "ships", "water", "waters", "wave", "waves", "deep", "fish", "fishes", "shore",
       "boat", "boats", "sail", "sailed", "mariners", "tempest", "flood", "floods", "net", "nets"}
PROMPTS = ["And it came to pass", "Then said he", "And the people", "Behold,"]


def words(text):
    return re.findall(r"[a-z]+", text.lower())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build" / "spark"))
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--strength", type=float, default=4.0)
    ap.add_argument("--layers", default="2-5")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "pos.txt").write_text("\n".join(POSITIVE) + "\n")
    (tmp / "neg.txt").write_text("\n".join(NEGATIVE) + "\n")
    subprocess.run([a.bin, "steer-extract", MODEL, "--positive", tmp / "pos.txt", "--negative", tmp / "neg.txt",
                    "--out", tmp / "sea.npy"], check=True, capture_output=True)
    counts = {}
    for label, extra in (("without", []), ("with", ["--steer", str(tmp / "sea.npy"), "--steer-layers", a.layers,
                                                   "--steer-strength", str(a.strength)])):
        total = sea = 0
        for i in range(a.samples):
            out = subprocess.run([a.bin, "run", "-m", MODEL, "-p", PROMPTS[i % len(PROMPTS)], "-n", "48",
                                  "--seed", str(i), *extra], check=True, capture_output=True, text=True).stdout
            w = words(out)
            total += len(w)
            sea += sum(x in SEA for x in w)
        counts[label] = (sea, total)
        print(f"{label:8s} steering: {sea} sea words in {total} ({100 * sea / max(total, 1):.2f} %)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Build spark-tiny's training corpus: the King James Bible from Debian's `bible-kjv`.

The text comes from the package's own reader (install it with
`apt-get install -y bible-kjv`), dumped whole with

    bible -l 100000 Gen1:1-Rev22:21 </dev/null

which pretty-prints each chapter as a heading line ("Genesis 1"), a blank line, and one
line per verse ("  1 In the beginning ..."); `-l 100000` only lifts the line-wrap limit
so each verse stays on one line. We drop the verse numbers (so the model writes prose,
not numbered lines) and keep the chapter headings:

    Genesis 1
    <blank>
    In the beginning God created the heaven and the earth.
    And the earth was without form, ...
    <blank>
    Genesis 2
    ...

The chapters (1,189) are split in Bible order, never inside a chapter:
  train: everything before the validation part (~93 %),
  val:   the ~2 % just before the test part; used only to pick the best checkpoint,
  test:  the chapters from the first one that starts past 95 % of the characters to the
         end of Revelation (~5 %); never seen by the tokenizer trainer or the model
         trainer; this is the held-out text whose perplexity is the quality gate.

Writes OUTDIR/{kjv,train,val,test}.txt (UTF-8, '\n' line ends) and OUTDIR/manifest.json
(sizes, sha256, first chapter of each part). The text is public domain (the 1611
translation's copyright has long expired; see /usr/share/doc/bible-kjv/copyright).

Usage: python3 tools/train/make_corpus.py [OUTDIR]   (default tools/train/data)
"""
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

TEST_FRACTION = 0.05
VAL_FRACTION = 0.02
HEADING = re.compile(r"^(?:[1-3] )?[A-Z][A-Za-z ]+ \d+$")
VERSE = re.compile(r"^ +\d+ (.*)$")


def dump_bible():
    """The whole KJV as the `bible` program prints it (stdin closed: it is interactive)."""
    out = subprocess.run(["bible", "-l", "100000", "Gen1:1-Rev22:21"],
                         stdin=subprocess.DEVNULL, capture_output=True, check=True)
    return out.stdout.decode("ascii")  # the package's text is pure ASCII; fail loudly if not


def chapters(raw):
    """Yield (heading, [verse text, ...]) for every chapter, in order."""
    heading, verses = None, []
    for line in raw.split("\n"):
        if not line.strip():
            continue
        m = VERSE.match(line)
        if m:
            if heading is None:
                raise ValueError("verse before any chapter heading")
            verses.append(m.group(1).strip())
        elif HEADING.match(line):
            if heading is not None:
                yield heading, verses
            heading, verses = line.strip(), []
        else:
            raise ValueError(f"unexpected line in bible output: {line!r}")
    if heading is not None:
        yield heading, verses


def chapter_text(heading, verses):
    return heading + "\n\n" + "\n".join(verses) + "\n\n"


def main():
    outdir = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "data")
    outdir.mkdir(parents=True, exist_ok=True)
    chaps = [chapter_text(h, v) for h, v in chapters(dump_bible())]
    heads = [c.split("\n", 1)[0] for c in chaps]
    if len(chaps) != 1189:
        raise SystemExit(f"expected 1189 chapters, got {len(chaps)}")
    total = sum(len(c) for c in chaps)

    def first_past(frac):
        acc = 0
        for i, c in enumerate(chaps):
            if acc >= frac * total:
                return i
            acc += len(c)
        return len(chaps)

    t0 = first_past(1.0 - TEST_FRACTION)
    v0 = first_past(1.0 - TEST_FRACTION - VAL_FRACTION)
    parts = {"train": chaps[:v0], "val": chaps[v0:t0], "test": chaps[t0:], "kjv": chaps}
    manifest = {"source": "Debian package bible-kjv: bible -l 100000 Gen1:1-Rev22:21",
                "chapters": len(chaps)}
    for name, cs in parts.items():
        text = "".join(cs)
        data = text.encode("utf-8")
        (outdir / f"{name}.txt").write_bytes(data)
        manifest[name] = {"bytes": len(data), "chapters": len(cs),
                          "first": cs[0].split("\n", 1)[0], "last": cs[-1].split("\n", 1)[0],
                          "sha256": hashlib.sha256(data).hexdigest()}
    (outdir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest, indent=1))
    assert heads[0] == "Genesis 1" and heads[-1] == "Revelation 22"


if __name__ == "__main__":
    main()

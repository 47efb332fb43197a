#!/usr/bin/env python3
"""Train the large Spark-style test tokenizer kept in tests/fixtures/.

What it makes: a byte-level BPE tokenizer.json with the 131,072-id layout of
Spark-X2.5 (SPEC §5): the same normalizer / pre-tokenizer / decoder settings
as the real file, the same 113 added tokens at their real ids (0-13 and
130,972-131,071 except 130,985), and, like the real vocabulary, the byte
symbol "Ć" (byte 0x06) displaced to id 130,985. Everything else (ids 14 to
130,971) is learnt by the HF `tokenizers` BPE trainer from multilingual text
assembled from files Debian packages install on this machine:

  * gettext catalogs (/usr/share/locale/*/LC_MESSAGES/*.mo): the translated
    strings of ~200 languages (CJK, Arabic, Hindi, Cyrillic, ...);
  * translated and English man pages (/usr/share/man);
  * package documentation (/usr/share/doc: changelogs, copyright texts);
  * C headers (/usr/include) for code;
  * Unicode data (/usr/share/unicode, package unicode-data) and an inventory
    of every assigned character, so rare scripts and emoji get tokens too.

Usage: python3 tools/make_tokenizer_fixture.py [--out tests/fixtures/spark-style-tokenizer.json.xz]
       [--mb 24] [--meta ../shared/tokenizers/spark-x2.5/tokenizer_meta.json]
The output is deterministic for a given machine (sorted file lists, fixed
budgets); it takes a few minutes on 2 cores.
"""
import argparse
import gettext
import gzip
import json
import lzma
import os
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_META = ROOT.parent / "shared" / "tokenizers" / "spark-x2.5" / "tokenizer_meta.json"
DISPLACED = ("\u0106", 130985)  # "Ć", the byte-level symbol of 0x06, as in the real vocab
FIRST_HIGH_ID = 130972


def read_text(path, limit):
    try:
        data = gzip.open(path).read(limit) if str(path).endswith(".gz") else open(path, "rb").read(limit)
    except (OSError, EOFError):
        return ""
    return data.decode("utf-8", errors="ignore")


def mo_strings(path):
    try:
        with open(path, "rb") as f:
            cat = gettext.GNUTranslations(f)._catalog
    except Exception:
        return []
    out = []
    for k, v in cat.items():
        if isinstance(v, str) and v and k:
            out.append(v)
    return out


def gather(budget):
    """Yield text chunks until `budget` bytes, alternating sources so the
    languages are mixed."""
    parts = []

    def take(name, texts, cap):
        used = 0
        for t in texts:
            if used >= cap:
                break
            b = len(t.encode("utf-8"))
            parts.append(t)
            used += b
        print(f"  {name}: {used / 1e6:.1f} MB", file=sys.stderr)

    mb = budget / 24e6  # budgets below are for 24 MB in total

    def locale_texts():
        for loc in sorted(os.listdir("/usr/share/locale")):
            d = Path("/usr/share/locale") / loc / "LC_MESSAGES"
            if not d.is_dir():
                continue
            got = 0
            for mo in sorted(d.glob("*.mo")):
                for s in mo_strings(mo):
                    got += len(s)
                    yield s + "\n"
                if got > 120_000:
                    break

    def man_texts(english):
        base = Path("/usr/share/man")
        langs = ["man1", "man3", "man5", "man8"] if english else sorted(
            p.name for p in base.iterdir() if not p.name.startswith("man"))
        for lang in langs:
            got = 0
            for f in sorted((base / lang).rglob("*.gz")):
                t = read_text(f, 200_000)
                got += len(t)
                yield t
                if got > 600_000:
                    break

    def doc_texts():
        for f in sorted(Path("/usr/share/doc").rglob("*")):
            if f.is_file() and (f.name.startswith(("changelog", "copyright", "README", "NEWS"))):
                yield read_text(f, 100_000)

    def header_texts():
        for f in sorted(Path("/usr/include").rglob("*.h")):
            yield read_text(f, 100_000)

    def unicode_texts():
        for name in ["NamesList.txt", "Unihan_Readings.txt", "Blocks.txt"]:
            p = Path("/usr/share/unicode") / name
            if p.exists():
                yield read_text(p, 3_000_000)
        # Every assigned, printable character, in runs, a few times over.
        chars = [chr(c) for c in range(0x20, 0x323B0)
                 if unicodedata.category(chr(c))[0] in "LMNPS" and not 0xD800 <= c <= 0xDFFF]
        for rep in range(2):
            for i in range(0, len(chars), 8):
                yield "".join(chars[i:i + 8]) + (" " if rep else "\n")

    take("gettext catalogs", locale_texts(), 9e6 * mb)
    take("translated man pages", man_texts(False), 5e6 * mb)
    take("English man pages", man_texts(True), 2.5e6 * mb)
    take("package docs", doc_texts(), 2.5e6 * mb)
    take("C headers", header_texts(), 2.5e6 * mb)
    take("Unicode data", unicode_texts(), 2.5e6 * mb)
    return parts


def train(meta, texts):
    from tokenizers import Tokenizer, pre_tokenizers, trainers

    low = [a for a in meta["added_tokens"] if a["id"] < FIRST_HIGH_ID]
    assert [a["id"] for a in low] == list(range(len(low)))
    skeleton = dict(meta)
    skeleton["added_tokens"] = []
    skeleton["model"] = dict(meta["model"], vocab={}, merges=[])
    tok = Tokenizer.from_str(json.dumps(skeleton))
    # One more id than the low block needs: "Ć" moves out of it afterwards.
    trainer = trainers.BpeTrainer(vocab_size=FIRST_HIGH_ID + 1, min_frequency=1, show_progress=False,
                                  special_tokens=[a["content"] for a in low],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return json.loads(tok.to_str())


def relayout(meta, trained):
    """Move "Ć" to 130985, close the gap, add the high added tokens."""
    vocab = trained["model"]["vocab"]
    if len(vocab) != FIRST_HIGH_ID + 1:
        sys.exit(f"trainer produced {len(vocab)} ids, need {FIRST_HIGH_ID + 1}: give it more text (--mb)")
    sym, new_id = DISPLACED
    old = vocab.pop(sym)
    vocab = {t: (i - 1 if i > old else i) for t, i in vocab.items()}
    vocab[sym] = new_id
    for a in meta["added_tokens"]:
        vocab[a["content"]] = a["id"]
    ids = sorted(vocab.values())
    assert ids == list(range(131072)), "ids must cover 0..131071 exactly"
    out = dict(meta)
    out["model"] = dict(meta["model"], vocab=dict(sorted(vocab.items(), key=lambda kv: kv[1])),
                        merges=trained["model"]["merges"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "spark-style-tokenizer.json.xz"))
    ap.add_argument("--meta", default=str(DEFAULT_META))
    ap.add_argument("--mb", type=float, default=24.0)
    args = ap.parse_args()
    meta = json.load(open(args.meta, encoding="utf-8"))
    print("gathering text:", file=sys.stderr)
    texts = gather(args.mb * 1e6)
    print(f"training on {sum(len(t) for t in texts) / 1e6:.1f} M characters ...", file=sys.stderr)
    result = relayout(meta, train(meta, texts))
    data = json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(args.out, "wb", preset=9 | lzma.PRESET_EXTREME) as f:
        f.write(data)
    print(f"wrote {args.out}: {len(data) / 1e6:.1f} MB json, {os.path.getsize(args.out) / 1e6:.1f} MB xz, "
          f"{len(result['model']['merges'])} merges", file=sys.stderr)


if __name__ == "__main__":
    main()

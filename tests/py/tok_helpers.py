"""Shared by the tokenizer tests: where the tokenizers are, and batch calls
into the spark binary (one process per corpus, not per string)."""
import json
import lzma
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from sparktest import ROOT, SPARK_BIN, run_spark

REAL_DIR = ROOT.parent / "shared" / "tokenizers" / "spark-x2.5"
FIXTURE_XZ = ROOT / "tests" / "fixtures" / "spark-style-tokenizer.json.xz"
BUILD = Path(os.environ.get("SPARK_BUILD", ROOT / "build"))


def real_dir():
    """The real Spark-X2.5 tokenizer directory, or skip."""
    if not (REAL_DIR / "tokenizer.json").exists() or not (REAL_DIR / "tokenizer.hf.json").exists():
        pytest.skip(f"real Spark tokenizer not found at {REAL_DIR} (shared/ is not checked out beside the repo)")
    return REAL_DIR


def fixture_json(tmp_dir):
    """Decompress the trained Spark-style fixture into tmp_dir; its path."""
    out = Path(tmp_dir) / "spark-style" / "tokenizer.json"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(lzma.open(FIXTURE_XZ).read())
    return out


def added_contents(tokenizer_json):
    return [a["content"] for a in json.load(open(tokenizer_json, encoding="utf-8"))["added_tokens"]]


def spark_encode_batch(model, strings, plain=False, timeout=600):
    """Ids for each string, from one `spark tokenize --file` run."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for s in strings:
            f.write(json.dumps(s) + "\n")
        path = f.name
    try:
        args = ["tokenize", model, "--file", path, "--json"] + (["--plain-specials"] if plain else [])
        proc = run_spark(args, timeout=timeout)
    finally:
        os.unlink(path)
    lines = proc.stdout.splitlines()
    assert len(lines) == len(strings), f"{len(lines)} results for {len(strings)} strings"
    return [json.loads(line) for line in lines]


def spark_decode_batch(model, id_lists, stream=False, skip_special=False, timeout=600):
    """Decoded text (or stream chunks) per id list, from one run. Output is
    read as bytes and decoded strictly, so invalid UTF-8 fails loudly."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for ids in id_lists:
            f.write(json.dumps(ids) + "\n")
        path = f.name
    try:
        cmd = [SPARK_BIN, "detokenize", str(model), "--file", path, "--stream" if stream else "--json"]
        if skip_special:
            cmd.append("--skip-special")
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout)
    finally:
        os.unlink(path)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")[-2000:]
    # split("\n"), not splitlines(): the text may hold U+2028, U+0085, ...
    lines = proc.stdout.decode("utf-8", errors="strict").split("\n")[:-1]
    assert len(lines) == len(id_lists)
    out = [json.loads(line) for line in lines]
    return out if stream else [o["text"] for o in out]


def report(name, line):
    """Print a result line and keep it in BUILD/tokenizer_report.txt."""
    print(line)
    try:
        with open(BUILD / "tokenizer_report.txt", "a", encoding="utf-8") as f:
            f.write(f"{name}: {line}\n")
    except OSError:
        pass

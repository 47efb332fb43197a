"""Small synthetic models with a real tokenizer, shared by the generation,
chat and server tests (made once per test session by tools/mkmodel.py)."""
from pathlib import Path

import mkmodel

ROOT = Path(__file__).resolve().parent.parent.parent
SPARK_TOKENIZER = ROOT.parent / "shared" / "tokenizers" / "spark-x2.5"
TINY = ROOT / "models" / "spark-tiny"


def tokenizer_dir():
    """The trained spark-tiny tokenizer when present (small, fast), else the
    real Spark tokenizer from shared/ (131072 ids)."""
    if (TINY / "tokenizer.json").exists():
        return TINY
    return SPARK_TOKENIZER


def make_chat_model(root, max_ctx=4096, seed=7):
    """A synthetic spark2_5 model carrying a real byte-level BPE tokenizer."""
    out = Path(root) / f"chatmodel-{max_ctx}-{seed}"
    if not (out / "config.json").exists():
        mkmodel.make_model(str(out), tokenizer=str(tokenizer_dir()), hidden=64, ff=128, layers=4, heads=4,
                           kv_heads=1, head_dim=32, window=16, max_ctx=max_ctx, seed=seed)
    return out

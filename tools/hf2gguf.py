#!/usr/bin/env python3
"""Convert a Hugging Face spark2_5 directory to a GGUF v3 file (SPEC sections 3-4).

    python3 tools/hf2gguf.py HF_DIR OUT.gguf [--dtype f32|f16|bf16|q8_0|keep] [--alignment N]

HF_DIR holds config.json, model.safetensors (or shards with
model.safetensors.index.json) and optionally tokenizer.json /
tokenizer_config.json / chat_template.jinja. --dtype keep (the default) writes
each matrix in its stored dtype; norms are always F32. An lm_head.weight of a
tied model is dropped (the embedding serves as the head).
Importable: convert(hf_dir, out, dtype='keep', alignment=None).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

from ref import check_config, hf_config, load_hf_tensors
from sparkgguf import write_gguf

_TAG_TO_DTYPE = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f32"}


def convert(hf_dir, out, dtype="keep", alignment=None):
    cfg = hf_config(hf_dir)
    check_config(cfg)
    stored = load_hf_tensors(hf_dir)
    tensors = {name: arr for name, (arr, _) in stored.items()}
    tied = cfg.get("tie_word_embeddings", True)
    if tied and "lm_head.weight" in tensors:
        emb = tensors.get("model.embedding.weight", tensors.get("model.embed_tokens.weight"))
        if emb is None or not np.array_equal(emb, tensors["lm_head.weight"]):
            print(f"hf2gguf: warning: {hf_dir}: tied model has an lm_head.weight that differs "
                  "from the embedding; dropping it as the config says tied", file=sys.stderr)
        del tensors["lm_head.weight"]
    if dtype == "keep":
        per = {name: _TAG_TO_DTYPE[tag] for name, (_, tag) in stored.items()}
        # the file's nominal type: that of the embedding
        emb_name = "model.embedding.weight" if "model.embedding.weight" in per else "model.embed_tokens.weight"
        write_gguf(out, cfg, tensors, per.get(emb_name, "f32"), tokenizer_dir=hf_dir,
                   alignment=alignment, tensor_dtypes=per)
    else:
        write_gguf(out, cfg, tensors, dtype, tokenizer_dir=hf_dir, alignment=alignment)


def main(argv=None):
    ap = argparse.ArgumentParser(description="convert an HF spark2_5 directory to GGUF")
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16", "q8_0", "keep"], default="keep")
    ap.add_argument("--alignment", type=int, default=None, help="general.alignment (power of two)")
    a = ap.parse_args(argv)
    if not (Path(a.hf_dir) / "config.json").exists():
        ap.error(f"{a.hf_dir}: no config.json")
    convert(a.hf_dir, a.out, a.dtype, a.alignment)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, KeyError, OSError) as e:  # a clean one-line error, not a traceback
        print(f"hf2gguf.py: error: {e}", file=sys.stderr)
        sys.exit(1)

#!/usr/bin/env python3
"""Write a synthetic spark2_5 checkpoint with seeded random weights.

Output: an HF directory (config.json in the real Spark-X2.5 format +
model.safetensors, or shards + model.safetensors.index.json) and/or a GGUF
file holding the same weights.

    python3 tools/mkmodel.py [OUT_DIR] [--gguf FILE] [--hidden 64] [--ff 128]
        [--layers 4] [--heads 4] [--kv-heads 2] [--head-dim 32] [--vocab 512]
        [--window 8] [--pattern SSSF] [--rope-factor-full 0.25]
        [--rope-factor-sliding 1.0] [--theta-full 5e6] [--theta-sliding 1e4]
        [--dtype f32|f16|bf16] [--seed 0] [--max-ctx 1024] [--eps 1e-6]
        [--tokenizer DIR] [--alias] [--shards N] [--untied] [--alignment N]
        [--gguf-dtype f32|f16|bf16|q8_0]

--pattern: S = sliding, F = full; layer i gets pattern[i % len(pattern)], so
"SSSF" gives the real model's layout (first layers only if fewer than 4) and an
explicit per-layer string works too.
Weights are drawn in float32 from a fixed order of draws, then rounded to
--dtype, so one seed gives the same model (up to rounding) in every dtype.

Importable: make_model(out_dir, **shape) -> config dict (shape keys are the
option names with '_' for '-': hidden, ff, layers, ..., gguf, shards, ...);
build_config(**shape) and make_weights(config, seed, dtype) work in memory.
"""
import argparse
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

from sparkgguf import DTYPES, GGUF_DTYPES, read_tokenizer, round_to_bf16, to_bf16_bits, write_gguf

DEFAULTS = dict(hidden=64, ff=128, layers=4, heads=4, kv_heads=2, head_dim=32, vocab=512, window=8,
                pattern="SSSF", rope_factor_full=0.25, rope_factor_sliding=1.0, theta_full=5e6,
                theta_sliding=1e4, dtype="f32", seed=0, max_ctx=1024, eps=1e-6, tokenizer=None,
                alias=False, shards=1, untied=False, gguf=None, gguf_dtype=None, alignment=None)

_TORCH_DTYPE = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def layer_types(pattern, n_layers):
    """Per-layer HF layer types: pattern[i % len(pattern)] (truncated if longer)."""
    p = pattern.upper()
    if not p or set(p) - {"S", "F"}:
        raise ValueError(f"--pattern {pattern!r}: use only S (sliding) and F (full)")
    return ["sliding_attention" if p[i % len(p)] == "S" else "full_attention" for i in range(n_layers)]


def _num(x):
    """Write whole floats as ints in JSON (5e6 -> 5000000), as the real config does."""
    return int(x) if float(x).is_integer() else float(x)


def build_config(**shape):
    s = dict(DEFAULTS, **shape)
    if s["heads"] % s["kv_heads"]:
        raise ValueError("heads must be a multiple of kv_heads")
    for key in ("rope_factor_full", "rope_factor_sliding"):
        r = s["head_dim"] * s[key]
        if r != int(r) or int(r) % 2 or r <= 0:
            raise ValueError(f"head_dim * {key} = {r} must be a positive even integer")
    return {
        "architectures": ["Spark2_5ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "dtype": _TORCH_DTYPE[s["dtype"]],
        "eos_token_id": 1,
        "gate_attn_act_mode": "sigmoid",
        "head_dim": s["head_dim"],
        "headwise_attn_output_gate": True,
        "hidden_act": "gelu",
        "hidden_size": s["hidden"],
        "initializer_range": 0.02,
        "intermediate_size": s["ff"],
        "layer_types": layer_types(s["pattern"], s["layers"]),
        "max_position_embeddings": s["max_ctx"],
        "mlp_bias": False,
        "model_type": "spark2_5",
        "num_attention_heads": s["heads"],
        "num_hidden_layers": s["layers"],
        "num_key_value_heads": s["kv_heads"],
        "pad_token_id": 2,
        "rms_norm_eps": s["eps"],
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": s["rope_factor_full"], "rope_theta": _num(s["theta_full"])},
            "sliding_attention": {"partial_rotary_factor": s["rope_factor_sliding"],
                                  "rope_theta": _num(s["theta_sliding"])},
        },
        "sliding_window": s["window"],
        "tie_word_embeddings": not s["untied"],
        "transformers_version": "4.57.1",
        "use_cache": True,
        "vocab_size": s["vocab"],
    }


def _round(a, dtype):
    if dtype == "f32":
        return a.astype(np.float32)
    if dtype == "f16":
        return a.astype(np.float16)
    if dtype == "bf16":
        return round_to_bf16(a)
    raise ValueError(f"unknown dtype {dtype!r}; one of {DTYPES}")


def make_weights(cfg, seed=0, dtype="f32", alias=False):
    """{HF name: array} with values representable in dtype (bf16 as float32 arrays).

    Scales: matrices N(0, 1/fan_in) so every projection keeps unit rms; norms
    1 + N(0, 0.1^2); embedding N(0, 1/sqrt(E)) so the tied-head logits have a
    std of a few units (softmax neither flat nor one-hot)."""
    rng = np.random.default_rng(seed)
    E, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, Hk, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def mat(rows, cols):
        return _round(rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols)), dtype)

    def norm(n):
        return _round(1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32), dtype)

    emb_name = "model.embed_tokens.weight" if alias else "model.embedding.weight"
    out_name = "o_proj" if alias else "out_proj"
    w = {emb_name: _round(rng.standard_normal((V, E), dtype=np.float32) * np.float32(E ** -0.25), dtype)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(E)
        w[p + "self_attn.q_k_v_proj.weight"] = mat((H + 2 * Hk) * D, E)
        w[p + "self_attn.g_proj.weight"] = mat(H, E)
        w[p + f"self_attn.{out_name}.weight"] = mat(E, H * D)
        w[p + "post_attention_layernorm.weight"] = norm(E)
        w[p + "mlp.gate_proj.weight"] = mat(F, E)
        w[p + "mlp.up_proj.weight"] = mat(F, E)
        w[p + "mlp.down_proj.weight"] = mat(E, F)
    w["model.norm.weight"] = norm(E)
    if not cfg.get("tie_word_embeddings", True):
        w["lm_head.weight"] = _round(rng.standard_normal((V, E), dtype=np.float32) * np.float32(E ** -0.25), dtype)
    return w


def _st_encode(arr, dtype):
    """(safetensors dtype tag, raw bytes) of one array."""
    if dtype == "bf16":
        return "BF16", to_bf16_bits(arr).tobytes()
    if dtype == "f16":
        return "F16", np.ascontiguousarray(arr, dtype=np.float16).tobytes()
    return "F32", np.ascontiguousarray(arr, dtype=np.float32).tobytes()


def write_safetensors(path, tensors, dtype):
    """One .safetensors file; returns its data size in bytes."""
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        tag, raw = _st_encode(arr, dtype)
        header[name] = {"dtype": tag, "shape": list(np.shape(arr)), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)  # data starts 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for raw in blobs:
            f.write(raw)
    return off


def write_hf(out_dir, cfg, weights, dtype, shards=1, tokenizer=None):
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if shards <= 1:
        write_safetensors(d / "model.safetensors", weights, dtype)
    else:
        _write_shards(d, weights, dtype, shards)
    if tokenizer:
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (Path(tokenizer) / f).exists():
                shutil.copyfile(Path(tokenizer) / f, d / f)


def _write_shards(d, weights, dtype, shards):
    names = list(weights)
    if shards > len(names):
        raise ValueError(f"--shards {shards} exceeds the {len(names)} tensors")
    # contiguous groups of nearly equal tensor counts, order kept
    groups = [list(g) for g in np.array_split(np.array(names, dtype=object), shards)]
    weight_map, total = {}, 0
    for k, group in enumerate(groups, 1):
        fname = f"model-{k:05d}-of-{shards:05d}.safetensors"
        total += write_safetensors(d / fname, {n: weights[n] for n in group}, dtype)
        weight_map.update({n: fname for n in group})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def make_model(out_dir=None, **shape):
    """Write the HF dir (if out_dir) and the GGUF (if gguf=FILE); return the config dict."""
    s = dict(DEFAULTS, **shape)
    unknown = set(shape) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"make_model: unknown options {sorted(unknown)}")
    if s["tokenizer"]:
        n_tok = len(read_tokenizer(s["tokenizer"])[0])
        if "vocab" not in shape:
            s["vocab"] = n_tok
        elif s["vocab"] != n_tok:
            raise ValueError(f"--vocab {s['vocab']} but tokenizer {s['tokenizer']} has {n_tok} ids")
    if out_dir is None and not s["gguf"]:
        raise ValueError("nothing to write: give an output directory and/or gguf=FILE")
    cfg = build_config(**{k: s[k] for k in DEFAULTS})
    weights = make_weights(cfg, s["seed"], s["dtype"], s["alias"])
    if out_dir is not None:
        write_hf(out_dir, cfg, weights, s["dtype"], s["shards"], s["tokenizer"])
    if s["gguf"]:
        write_gguf(s["gguf"], cfg, weights, s["gguf_dtype"] or s["dtype"], tokenizer_dir=s["tokenizer"],
                   alignment=s["alignment"])
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a synthetic spark2_5 checkpoint")
    ap.add_argument("out_dir", nargs="?", help="HF directory to write")
    ap.add_argument("--gguf", help="also (or only) write this GGUF file")
    for key, val in DEFAULTS.items():
        if key in ("gguf", "gguf_dtype", "alias", "untied", "tokenizer", "alignment"):
            continue
        kind = type(val) if val is not None else str
        ap.add_argument("--" + key.replace("_", "-"), type=kind, default=None,
                        choices=DTYPES if key == "dtype" else None)
    ap.add_argument("--tokenizer", help="dir with tokenizer.json (+ tokenizer_config.json) to copy in")
    ap.add_argument("--alias", action="store_true", help="write model.embed_tokens / o_proj names")
    ap.add_argument("--untied", action="store_true", help="untied head: write lm_head.weight")
    ap.add_argument("--alignment", type=int, help="GGUF general.alignment")
    ap.add_argument("--gguf-dtype", choices=GGUF_DTYPES, help="GGUF matrix dtype (default: --dtype)")
    a = ap.parse_args(argv)
    if a.out_dir is None and a.gguf is None:
        ap.error("give OUT_DIR and/or --gguf FILE")
    # `is` tests: a given 0 (e.g. --seed 0) must not be mistaken for an absent flag
    shape = {k: v for k, v in vars(a).items() if k != "out_dir" and v is not None and v is not False}
    make_model(a.out_dir, **shape)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, KeyError, OSError) as e:  # a clean one-line error, not a traceback
        print(f"mkmodel.py: error: {e}", file=sys.stderr)
        sys.exit(1)

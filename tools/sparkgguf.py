"""Write spark2_5 GGUF v3 files (SPEC section 4) with the `gguf` package.

API:
    write_gguf(path, config, tensors, dtype='f32', tokenizer_dir=None,
               alignment=None, tensor_dtypes=None)

config is an HF config.json dict (real format: layer_types, rope_parameters,
head_dim, ...). tensors maps HF names (SPEC section 3, aliases accepted) or
GGUF names to float arrays in PyTorch [out, in] layout. Matrices are written in
`dtype` ('f32' | 'f16' | 'bf16' | 'q8_0'; per-tensor overrides in
tensor_dtypes, keyed like `tensors`); norm weights always as F32, as llama.cpp
does. q8_0 (gguf.quants' quantizer) needs row lengths that are multiples of 32. A tied model
gets no `output` tensor. Also: to_bf16_bits / round_to_bf16 / gguf_name.
"""
import json
from pathlib import Path

import numpy as np

ARCH = "spark2_5"
DTYPES = ("f32", "f16", "bf16")
GGUF_DTYPES = DTYPES + ("q8_0",)  # Q8_0 via gguf.quants, for quantized-path tests

# per-layer HF suffix -> GGUF suffix
_LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_k_v_proj.weight": "attn_qkv.weight",
    "self_attn.g_proj.weight": "attn_gate.weight",
    "self_attn.out_proj.weight": "attn_output.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_MAP = {
    "model.embedding.weight": "token_embd.weight",
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_GGUF_LAYER_NAMES = set(_LAYER_MAP.values())
_GGUF_GLOBAL_NAMES = {"token_embd.weight", "output_norm.weight", "output.weight"}


def gguf_name(name):
    """GGUF tensor name for an HF (or already GGUF) tensor name; KeyError if unknown."""
    if name in _GLOBAL_MAP:
        return _GLOBAL_MAP[name]
    if name in _GGUF_GLOBAL_NAMES:
        return name
    parts = name.split(".")
    if name.startswith("model.layers.") and len(parts) > 3 and parts[2].isdigit():
        suffix = ".".join(parts[3:])
        if suffix in _LAYER_MAP:
            return f"blk.{parts[2]}.{_LAYER_MAP[suffix]}"
    if name.startswith("blk.") and len(parts) > 2 and parts[1].isdigit():
        if ".".join(parts[2:]) in _GGUF_LAYER_NAMES:
            return name
    raise KeyError(f"unknown spark2_5 tensor name {name!r}")


def to_bf16_bits(a):
    """float array -> uint16 bf16 bit patterns, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def round_to_bf16(a):
    """float array -> float32 array of the nearest bf16 values."""
    return (to_bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def _is_norm(gname):
    return gname.endswith("_norm.weight")


def _encode(gname, arr, dtype):
    """(numpy array to write, raw GGML type or None) for one tensor."""
    from gguf import GGMLQuantizationType as Q
    arr = np.asarray(arr)
    if _is_norm(gname) or dtype == "f32":
        return np.ascontiguousarray(arr, dtype=np.float32), None
    if dtype == "f16":
        return np.ascontiguousarray(arr, dtype=np.float16), None
    if dtype == "bf16":
        return to_bf16_bits(arr), Q.BF16
    if dtype == "q8_0":
        import gguf.quants
        if arr.shape[-1] % 32:
            raise ValueError(f"tensor {gname}: row length {arr.shape[-1]} is not a multiple of 32 (Q8_0 block)")
        return gguf.quants.quantize(np.asarray(arr, dtype=np.float32), Q.Q8_0), Q.Q8_0
    raise ValueError(f"unknown dtype {dtype!r}; one of {GGUF_DTYPES}")


def _rot_dims(head_dim, factor):
    r = head_dim * float(factor)
    if r != int(r) or int(r) % 2:
        raise ValueError(f"rotary dims head_dim*factor = {r} is not an even integer")
    return int(r)


def _add_hparams(w, cfg):
    from gguf import GGUFValueType as T
    p = ARCH + "."
    n_layers = cfg["num_hidden_layers"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    types = cfg["layer_types"]
    if len(types) != n_layers:
        raise ValueError("config: len(layer_types) != num_hidden_layers")
    for t in types:
        if t not in ("sliding_attention", "full_attention"):
            raise ValueError(f"config: unknown layer type {t!r}")
    rp = cfg["rope_parameters"]
    full, swa = rp["full_attention"], rp["sliding_attention"]
    u32 = {
        "block_count": n_layers,
        "context_length": cfg.get("max_position_embeddings", 4096),
        "embedding_length": cfg["hidden_size"],
        "feed_forward_length": cfg["intermediate_size"],
        "attention.head_count": cfg["num_attention_heads"],
        "attention.head_count_kv": cfg["num_key_value_heads"],
        "attention.key_length": D,
        "attention.value_length": D,
        "vocab_size": cfg["vocab_size"],
        "attention.sliding_window": cfg["sliding_window"],
        "rope.dimension_count": _rot_dims(D, full.get("partial_rotary_factor", 1.0)),
        "rope.dimension_count_swa": _rot_dims(D, swa.get("partial_rotary_factor", 1.0)),
    }
    for k, v in u32.items():
        w.add_uint32(p + k, int(v))
    w.add_float32(p + "attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"]))
    w.add_float32(p + "rope.freq_base", float(full["rope_theta"]))     # FULL-layer theta
    w.add_float32(p + "rope.freq_base_swa", float(swa["rope_theta"]))  # sliding theta
    w.add_key_value(p + "attention.sliding_window_pattern",
                    [t == "sliding_attention" for t in types], T.ARRAY, sub_type=T.BOOL)  # TRUE = sliding


def read_tokenizer(tokenizer_dir):
    """(tokens, token_types, merges, chat_template or None) from an HF tokenizer dir."""
    d = Path(tokenizer_dir)
    tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    model = tj["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{d}/tokenizer.json: model type {model.get('type')!r}, need BPE")
    by_id = {int(i): tok for tok, i in model["vocab"].items()}
    kind = {}
    for at in tj.get("added_tokens", []):
        by_id[int(at["id"])] = at["content"]
        kind[int(at["id"])] = 3 if at.get("special") else 4  # control / user-defined
    n = max(by_id) + 1
    tokens, types = [], []
    for i in range(n):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(kind.get(i, 1))
        else:
            tokens.append(f"[PAD{i}]")  # hole in the id space
            types.append(5)            # unused
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    template = None
    tc = d / "tokenizer_config.json"
    if tc.exists():
        template = json.loads(tc.read_text(encoding="utf-8")).get("chat_template")
    if template is None and (d / "chat_template.jinja").exists():
        template = (d / "chat_template.jinja").read_text(encoding="utf-8")
    return tokens, types, merges, template


def _add_tokenizer(w, cfg, tokenizer_dir):
    from gguf import GGUFValueType as T
    tokens, types, merges, template = read_tokenizer(tokenizer_dir)
    if len(tokens) != cfg["vocab_size"]:
        raise ValueError(f"{tokenizer_dir}: tokenizer has {len(tokens)} ids, config vocab_size {cfg['vocab_size']}")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", ARCH)
    w.add_key_value("tokenizer.ggml.tokens", tokens, T.ARRAY, sub_type=T.STRING)
    w.add_key_value("tokenizer.ggml.token_type", types, T.ARRAY, sub_type=T.INT32)
    if merges:
        w.add_key_value("tokenizer.ggml.merges", merges, T.ARRAY, sub_type=T.STRING)
    if template:
        w.add_string("tokenizer.chat_template", template)


def _add_special_ids(w, cfg):
    for key, field in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id")):
        v = cfg.get(field)
        if isinstance(v, list):  # HF allows a list of eos ids; GGUF keeps one
            v = v[0] if v else None
        if v is not None:
            w.add_uint32(f"tokenizer.ggml.{key}_token_id", int(v))
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_bool("tokenizer.ggml.add_eos_token", False)


def _file_type(dtype):
    return {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7}[dtype]  # llama_ftype values


def write_gguf(path, config, tensors, dtype="f32", tokenizer_dir=None, alignment=None, tensor_dtypes=None):
    """Write a spark2_5 GGUF v3 file; see the module docstring."""
    import gguf
    if dtype not in GGUF_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {GGUF_DTYPES}")
    tensor_dtypes = tensor_dtypes or {}
    tied = config.get("tie_word_embeddings", True)
    named = {}
    for name, arr in tensors.items():
        g = gguf_name(name)
        if g in named:
            raise ValueError(f"tensor {g} given twice (as {named[g][0]!r} and {name!r})")
        named[g] = (name, arr)
    if tied and "output.weight" in named:
        del named["output.weight"]  # tied head: the embedding serves as the output matrix
    _check_complete(named, config)

    w = gguf.GGUFWriter(str(path), ARCH)
    if alignment is not None and alignment != gguf.GGUF_DEFAULT_ALIGNMENT:
        w.add_custom_alignment(int(alignment))
    w.add_name(str(config.get("_name_or_path") or ARCH))
    w.add_file_type(_file_type(dtype))
    _add_hparams(w, config)
    _add_special_ids(w, config)
    if tokenizer_dir is not None and (Path(tokenizer_dir) / "tokenizer.json").exists():
        _add_tokenizer(w, config, tokenizer_dir)
    for g in _tensor_order(named, config["num_hidden_layers"]):
        name, arr = named[g]
        data, raw = _encode(g, arr, tensor_dtypes.get(name, dtype))
        w.add_tensor(g, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tensor_order(named, n_layers):
    order = ["token_embd.weight"]
    for i in range(n_layers):
        order += [f"blk.{i}.{s}" for s in ("attn_norm.weight", "attn_qkv.weight", "attn_gate.weight",
                                           "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight",
                                           "ffn_up.weight", "ffn_down.weight")]
    order.append("output_norm.weight")
    if "output.weight" in named:
        order.append("output.weight")
    return order


def _check_complete(named, cfg):
    E, F = cfg["hidden_size"], cfg["intermediate_size"]
    H, Hk = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or E // H
    want = {"token_embd.weight": (cfg["vocab_size"], E), "output_norm.weight": (E,)}
    if "output.weight" in named or not cfg.get("tie_word_embeddings", True):
        want["output.weight"] = (cfg["vocab_size"], E)
    for i in range(cfg["num_hidden_layers"]):
        b = f"blk.{i}."
        want.update({b + "attn_norm.weight": (E,), b + "attn_qkv.weight": ((H + 2 * Hk) * D, E),
                     b + "attn_gate.weight": (H, E), b + "attn_output.weight": (E, H * D),
                     b + "ffn_norm.weight": (E,), b + "ffn_gate.weight": (F, E),
                     b + "ffn_up.weight": (F, E), b + "ffn_down.weight": (E, F)})
    for g, shape in want.items():
        if g not in named:
            raise ValueError(f"missing tensor {g}")
        got = tuple(np.shape(named[g][1]))
        if got != shape:
            raise ValueError(f"tensor {g} ({named[g][0]}): shape {got}, expected {shape}")
    extra = set(named) - set(want)
    if extra:
        raise ValueError(f"unexpected tensors: {sorted(extra)}")

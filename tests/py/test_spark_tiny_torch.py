"""spark-tiny's stored reference numbers hold on this machine, on the CPU.

models/spark-tiny/reference.json was written by tools/train/train.py on the GPU: held-out
perplexity under a fixed protocol (per-window NLL sums included) and greedy continuations
of three prompts, all from the bf16 checkpoint upcast to fp32. These tests recompute a
prefix of them here in two independent ways:

  * numpy (always runs; needs only numpy and tokenizers): a from-scratch float64
    forward pass written from SPEC §2 directly over the safetensors bytes, sharing no
    code with the PyTorch model. If it agrees with the stored numbers, the PyTorch model
    that produced them computes SPEC §2 (or both make the same mistake, which two
    separate writings make unlikely), so the numbers are a fair target for spark.c.
  * PyTorch (skipped where torch is not installed): tools/train/model.py loaded from the
    HF directory must reproduce its own stored numbers on the CPU.

SPARK_TINY_DIR overrides the model directory (for checking a fresh export before it is
committed).
"""
import json
import math
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(os.environ.get("SPARK_TINY_DIR", ROOT / "models" / "spark-tiny"))
NUMPY_WINDOWS = 2          # numpy is slower; the torch check covers the stored subset


def _need_model():
    if not (MODEL_DIR / "reference.json").exists():
        pytest.fail(f"{MODEL_DIR} has no reference.json: spark-tiny is not exported")


def reference():
    return json.loads((MODEL_DIR / "reference.json").read_text(encoding="utf-8"))


def heldout_ids():
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    text = (MODEL_DIR / "heldout.txt").read_text(encoding="utf-8")
    return tk, tk.encode(text).ids


# ------------------------------------------------------------ numpy reference

def read_safetensors(path):
    """name -> float64 array, parsed from the raw file (bf16/f32 only)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        buf = raw[base + a:base + b]
        if meta["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif meta["dtype"] == "F32":
            arr = np.frombuffer(buf, dtype="<f4")
        else:
            raise ValueError(f"{name}: dtype {meta['dtype']} not handled here")
        out[name] = arr.reshape(meta["shape"]).astype(np.float64)
    return out


def erf(x):
    """erf to ~1e-14 in float64, vectorised (numpy has none, and a reference should not
    lean on a 1e-7 fit): the Maclaurin series below 2.5, the classic continued fraction
    for erfc from 2.5 to 6, and +-1 beyond (erfc(6) < 3e-17)."""
    x = np.asarray(x, dtype=np.float64)
    ax = np.abs(x)
    out = np.sign(x)
    small = ax < 2.5
    if small.any():
        z = x[small]
        z2 = z * z
        term, acc = z.copy(), z.copy()
        for n in range(1, 48):   # x^2n/n! < 1e-16 by n = 47 for |x| < 2.5
            term = term * (-z2) / n
            acc = acc + term / (2 * n + 1)
        out[small] = 2.0 / math.sqrt(math.pi) * acc
    mid = (ax >= 2.5) & (ax < 6.0)
    if mid.any():
        z = ax[mid]
        # erfc(z) = exp(-z^2)/sqrt(pi) / (z + (1/2)/(z + 1/(z + (3/2)/(z + 2/(z + ...)))))
        f = z.copy()
        for k in range(120, 0, -1):
            f = z + (k / 2.0) / f
        erfc = np.exp(-z * z) / math.sqrt(math.pi) / f
        out[mid] = np.sign(x[mid]) * (1.0 - erfc)
    return out


class NumpySpark:
    """SPEC §2 in float64, one sequence at a time, no cache."""

    def __init__(self, model_dir):
        self.c = json.loads((Path(model_dir) / "config.json").read_text())
        self.w = read_safetensors(Path(model_dir) / "model.safetensors")

    def rope(self, x, kind, pos):
        c = self.c
        rp = c["rope_parameters"][kind]
        R = int(c["head_dim"] * rp["partial_rotary_factor"])
        inv = rp["rope_theta"] ** (-2.0 * np.arange(R // 2) / R)
        ang = pos[:, None] * inv[None, :]                     # [T, R/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., :R // 2], x[..., R // 2:R]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., R:]], axis=-1)

    def logits(self, ids):
        c, w = self.c, self.w
        T = len(ids)
        H, Hk, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        eps = c["rms_norm_eps"]

        def rms(x, g):
            return g * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)

        pos = np.arange(T, dtype=np.float64)
        delta = pos[:, None] - pos[None, :]
        h = w["model.embedding.weight"][np.asarray(ids)]
        for i, kind in enumerate(c["layer_types"]):
            p = f"model.layers.{i}."
            x = rms(h, w[p + "input_layernorm.weight"])
            qkv = x @ w[p + "self_attn.q_k_v_proj.weight"].T
            gate = 1.0 / (1.0 + np.exp(-(x @ w[p + "self_attn.g_proj.weight"].T)))  # [T, H]
            q = qkv[:, :H * D].reshape(T, H, D)
            k = qkv[:, H * D:(H + Hk) * D].reshape(T, Hk, D)
            v = qkv[:, (H + Hk) * D:].reshape(T, Hk, D)
            q, k = self.rope(q, kind, pos), self.rope(k, kind, pos)
            if kind == "full_attention":
                allowed = delta >= 0
            else:
                allowed = (delta >= 0) & (delta < c["sliding_window"])
            o = np.empty((T, H, D))
            for hh in range(H):
                kv = hh // (H // Hk)
                s = (q[:, hh] @ k[:, kv].T) * D ** -0.5
                s = np.where(allowed, s, -np.inf)
                s = np.exp(s - s.max(-1, keepdims=True))
                o[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
            o *= gate[:, :, None]
            h = h + o.reshape(T, H * D) @ w[p + "self_attn.out_proj.weight"].T
            x = rms(h, w[p + "post_attention_layernorm.weight"])
            a = x @ w[p + "mlp.gate_proj.weight"].T
            a = 0.5 * a * (1.0 + erf(a / math.sqrt(2.0)))
            h = h + (a * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        h = rms(h, w["model.norm.weight"])
        return h @ w["model.embedding.weight"].T


def window_nll_sum(logits, ids):
    lg = logits[:-1]
    m = lg.max(-1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(lg - m).sum(-1)))
    return float((lse - lg[np.arange(len(ids) - 1), ids[1:]]).sum())


def torch_model():
    """tools/train/model.py, loaded by path under its own name: a plain `import model`
    could pick up some other test's module of that name."""
    import importlib.util
    name = "spark_tiny_train_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "train" / "model.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def test_export_files_and_config():
    _need_model()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "reference.json", "heldout.txt", "MODEL_CARD.md"):
        assert (MODEL_DIR / name).exists(), name
    assert (MODEL_DIR / "model.safetensors").stat().st_size <= 25 * 2**20
    c = json.loads((MODEL_DIR / "config.json").read_text())
    assert c["model_type"] == "spark2_5" and c["tie_word_embeddings"]
    assert c["head_dim"] * c["num_attention_heads"] != c["hidden_size"]
    assert c["num_attention_heads"] > c["num_key_value_heads"]
    assert c["layer_types"] == (["sliding_attention"] * 3 + ["full_attention"]) * (
        c["num_hidden_layers"] // 4)
    assert c["sliding_window"] < reference()["heldout"]["ctx"]


def test_tokenizer_layout():
    _need_model()
    tk, ids = heldout_ids()
    ref = reference()
    assert len(ids) == ref["heldout"]["tokens"]
    meta = json.loads((MODEL_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {t["id"]: t for t in meta["added_tokens"]}
    V = tk.get_vocab_size(with_added_tokens=True)
    assert by_id[0]["content"] == "<｜start▁of▁sentence｜>" and by_id[0]["special"]
    assert by_id[1]["content"] == "<｜end▁of▁sentence｜>" and by_id[2]["content"] == "<｜▁pad▁｜>"
    assert by_id[3]["content"] == "<think>" and by_id[4]["content"] == "</think>"
    assert by_id[V - 13]["content"] == "<|System|>" and by_id[V - 1]["content"] == "</tool_call>"
    assert tk.encode("<|User|>hi").ids[0] == V - 12


def test_numpy_forward_matches_stored_heldout_nll():
    _need_model()
    ref = reference()["heldout"]
    _, ids = heldout_ids()
    npm = NumpySpark(MODEL_DIR)
    ctx = ref["ctx"]
    for wdw in ref["windows"][:NUMPY_WINDOWS]:
        s = wdw["start"]
        chunk = ids[s:s + ctx]
        got = window_nll_sum(npm.logits(chunk), np.asarray(chunk))
        assert wdw["scored"] == len(chunk) - 1
        # fp32 (device) against float64 (here): per-token NLL agrees to ~1e-5 relative.
        assert abs(got - wdw["nll_sum"]) <= 2e-4 * abs(wdw["nll_sum"]) + 1e-3, (s, got, wdw)


def greedy_mismatches(logits, case):
    """Teacher-force prompt + stored continuation: since the model is causal, the
    continuation is the greedy one iff each stored id is the argmax at the position
    before it. Returns [(step, argmax, stored id, stored margin)] where they differ."""
    n_prompt = len(case["prompt_ids"])
    bad = []
    for step, (want, margin) in enumerate(zip(case["greedy_ids"], case["margins"])):
        got = int(np.argmax(logits[n_prompt - 1 + step]))
        if got != want:
            bad.append((step, got, want, margin))
    return bad


def test_numpy_greedy_matches_stored_continuations():
    _need_model()
    npm = NumpySpark(MODEL_DIR)
    for case in reference()["greedy"]:
        ids = case["prompt_ids"] + case["greedy_ids"][:-1]
        bad = greedy_mismatches(npm.logits(ids), case)
        # Only a near-tie may flip between fp32 (device) and float64 (here); everything
        # after a flip would be a different text, so the first one must be a near-tie.
        assert not bad or bad[0][3] < 1e-3, (case["prompt"], bad[:3])


def test_torch_model_reproduces_subset_perplexity():
    torch = pytest.importorskip("torch")
    _need_model()
    M = torch_model()
    ref = reference()["heldout"]
    _, ids = heldout_ids()
    m = M.load_hf(MODEL_DIR, dtype=torch.float32, device="cpu")
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    w = M.window_nll(m, torch.tensor(ids), ref["ctx"], "cpu",
                     max_windows=ref["subset"]["windows"], batch=4)
    ppl = M.ppl_of(w)[0]
    assert abs(ppl - ref["subset"]["ppl"]) <= 1e-4 * ref["subset"]["ppl"], (ppl, ref["subset"])
    for (s, n, v), want in zip(w, ref["windows"]):
        assert (s, n) == (want["start"], want["scored"])
        assert abs(v - want["nll_sum"]) <= 1e-4 * abs(want["nll_sum"]) + 1e-3


def test_torch_greedy_reproduces_stored_continuations():
    torch = pytest.importorskip("torch")
    _need_model()
    M = torch_model()
    m = M.load_hf(MODEL_DIR, dtype=torch.float32, device="cpu")
    for case in reference()["greedy"]:
        ids = case["prompt_ids"] + case["greedy_ids"][:-1]
        with torch.no_grad():
            logits = m(torch.tensor([ids]))[0].double().numpy()
        assert greedy_mismatches(logits, case) == [], case["prompt"]

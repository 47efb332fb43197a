"""Tests of the Python reference (tools/ref.py) and model tooling themselves.

Each check is derived from SPEC section 2's formulas directly (hand loops,
math.erf), not from ref.py's vectorised code, so that the reference the C
runtime is compared against is itself trusted. Also checks that mkmodel's HF
directory, its GGUF and hf2gguf's GGUF give the same model.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parent.parent.parent / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import hf2gguf  # noqa: E402
import mkmodel  # noqa: E402
import ref  # noqa: E402

TOKENIZER_DIR = Path("/work/shared/tokenizers/spark-x2.5")


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("ref")


def build(tmp, name, **shape):
    """Write an HF dir tmp/name from mkmodel and load it with ref."""
    mkmodel.make_model(tmp / name, **shape)
    return ref.load_model(tmp / name)


# ---------------------------------------------------------------- pieces

def test_erf_matches_math_erf():
    rng = np.random.default_rng(0)
    xs = np.concatenate([np.linspace(-7, 7, 20001), rng.normal(0, 2, 20000),
                         np.linspace(-1e-6, 1e-6, 101), [0.0, 1.0, -1.0, 6.5, 30.0, -30.0, 1e-300]])
    want = np.array([math.erf(v) for v in xs])
    assert np.max(np.abs(ref.erf(xs) - want)) <= 1e-15
    assert ref.erf(np.array([np.inf, -np.inf])).tolist() == [1.0, -1.0]


def test_gelu_is_erf_form():
    xs = np.linspace(-9, 9, 4001)
    want = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in xs])
    assert np.all(np.abs(ref.gelu(xs) - want) <= 1e-15 * np.maximum(1.0, np.abs(xs)))
    # the tanh form is a different function (SPEC: drifts up to ~5e-4)
    d = np.max(np.abs(ref.gelu_tanh(xs) - want))
    assert 1e-5 < d < 1e-3


def test_rmsnorm_and_sigmoid_by_hand():
    x = np.array([[1.0, -2.0, 3.0, 0.5]])
    w = np.array([1.0, 0.5, 2.0, -1.0])
    ms = (1 + 4 + 9 + 0.25) / 4
    want = w * x / math.sqrt(ms + 1e-6)
    assert np.allclose(ref.rmsnorm(x, w, 1e-6), want, rtol=1e-15, atol=0)
    for v in (-800.0, -30.0, -3.0, 0.0, 2.5, 800.0):
        want = 1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))
        assert abs(float(ref.sigmoid(np.array(v))) - want) <= 1e-16 * want


def hand_rope(vec, pos, R, theta):
    """SPEC: pairs (j, j + R/2) for j < R/2, angle = pos * theta^(-2j/R); rest untouched."""
    out = list(vec)
    for j in range(R // 2):
        ang = pos * theta ** (-2.0 * j / R)
        a, b = vec[j], vec[j + R // 2]
        out[j] = a * math.cos(ang) - b * math.sin(ang)
        out[j + R // 2] = b * math.cos(ang) + a * math.sin(ang)
    return out


@pytest.mark.parametrize("D,R,theta", [(12, 8, 100.0), (32, 8, 5e6), (16, 16, 1e4)])
def test_rope_matches_hand_computation(D, R, theta):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 3, D))  # [n, heads, D]
    pos = np.array([0, 1, 7, 1000])
    got = ref.rope(x, pos, R, theta)
    for i, p in enumerate(pos):
        for h in range(3):
            assert np.allclose(got[i, h], hand_rope(x[i, h].tolist(), int(p), R, theta), rtol=0, atol=1e-12)
    assert np.array_equal(got[..., R:], x[..., R:])  # dims R..D-1 bit-identical
    assert np.array_equal(got[0], x[0])  # position 0 is the identity


def test_rope_depends_on_relative_position_only():
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(1, 1, 16)), rng.normal(size=(1, 1, 16))

    def score(pq, pk):
        return float(np.sum(ref.rope(q, [pq], 8, 1e4) * ref.rope(k, [pk], 8, 1e4)))
    assert abs(score(5, 2) - score(103, 100)) < 1e-10
    assert abs(score(5, 2) - score(5, 3)) > 1e-6


def test_window_and_causal_masks_match_predicate():
    for n in (1, 5, 17):
        for window in (1, 2, 4, 16, 40):
            m = ref.window_mask(n, window)
            want = np.array([[0 <= p - j < window for j in range(n)] for p in range(n)])
            assert np.array_equal(m, want)
            assert np.array_equal(ref.attn_mask(n, True, window), want)
            wide = np.array([[0 <= p - j <= window for j in range(n)] for p in range(n)])
            assert np.array_equal(ref.attn_mask(n, True, window, "window_off_by_one"), wide)
        causal = np.array([[j <= p for j in range(n)] for p in range(n)])
        assert np.array_equal(ref.causal_mask(n), causal)
        assert np.array_equal(ref.attn_mask(n, False, 3), causal)


def test_gqa_mapping():
    assert [ref.kv_head_of(h, 8, 2) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [ref.kv_head_of(h, 4, 4) for h in range(4)] == [0, 1, 2, 3]
    rng = np.random.default_rng(3)
    n, H, Hk, D = 5, 8, 2, 4
    q, k, v = rng.normal(size=(n, H, D)), rng.normal(size=(n, Hk, D)), rng.normal(size=(n, Hk, D))
    mask = ref.window_mask(n, 3)
    got = ref.attention(q, k, v, mask, D ** -0.5)
    for h in range(H):
        kv = h // (H // Hk)
        for p in range(n):
            js = [j for j in range(n) if mask[p, j]]
            s = np.array([q[p, h] @ k[j, kv] / math.sqrt(D) for j in js])
            w = np.exp(s - s.max())
            w /= w.sum()
            assert np.allclose(got[p, h], sum(wi * v[j, kv] for wi, j in zip(w, js)), atol=1e-13)


# ---------------------------------------------------------------- forward vs hand

def gelu_math(x):
    return np.array([0.5 * t * (1.0 + math.erf(t / math.sqrt(2.0))) for t in x])


def hand_norm(x, w, eps):
    return w * x / math.sqrt(float(np.mean(x * x)) + eps)


def hand_forward(m, ids):
    """Per-position, per-head loops straight from SPEC section 2."""
    H, Hk, D = m.n_heads, m.n_kv_heads, m.head_dim
    n = len(ids)
    hs = [m.embedding[t].copy() for t in ids]
    for li, L in enumerate(m.layers):
        R, theta = (m.rope_dims_swa, m.theta_swa) if m.sliding[li] else (m.rope_dims_full, m.theta_full)
        qs, ks, vs, gs = [], [], [], []
        for p in range(n):
            x = hand_norm(hs[p], L.attn_norm, m.eps)
            qkv = L.qkv @ x
            gs.append(1.0 / (1.0 + np.exp(-(L.gate @ x))))
            qs.append([hand_rope(qkv[h * D:(h + 1) * D].tolist(), p, R, theta) for h in range(H)])
            ks.append([hand_rope(qkv[(H + c) * D:(H + c + 1) * D].tolist(), p, R, theta) for c in range(Hk)])
            vs.append([qkv[(H + Hk + c) * D:(H + Hk + c + 1) * D] for c in range(Hk)])
        new = []
        for p in range(n):
            visible = [j for j in range(n) if (0 <= p - j < m.window if m.sliding[li] else j <= p)]
            o = []
            for h in range(H):
                c = h // (H // Hk)
                s = np.array([np.dot(qs[p][h], ks[j][c]) / math.sqrt(D) for j in visible])
                w = np.exp(s - s.max())
                w /= w.sum()
                o.append(gs[p][h] * sum(wi * vs[j][c] for wi, j in zip(w, visible)))
            h1 = hs[p] + L.out @ np.concatenate(o)
            x = hand_norm(h1, L.ffn_norm, m.eps)
            new.append(h1 + L.ffn_down @ (gelu_math(L.ffn_gate @ x) * (L.ffn_up @ x)))
        hs = new
    return np.array([m.embedding @ hand_norm(h, m.final_norm, m.eps) for h in hs])


def test_forward_one_token_by_hand(tmp):
    m = build(tmp, "one", hidden=24, ff=40, layers=2, heads=4, kv_heads=2, head_dim=8, vocab=50,
              pattern="SF", seed=5)
    for tok in (0, 17, 49):
        got = ref.forward(m, [tok])
        # one token at position 0: rope is the identity and attention returns v itself
        h = m.embedding[tok].copy()
        for L in m.layers:
            x = hand_norm(h, L.attn_norm, m.eps)
            v = (L.qkv @ x)[(m.n_heads + m.n_kv_heads) * m.head_dim:]
            g = 1.0 / (1.0 + np.exp(-(L.gate @ x)))
            o = np.concatenate([g[hh] * v[(hh // 2) * 8:(hh // 2) * 8 + 8] for hh in range(4)])
            h = h + L.out @ o
            x = hand_norm(h, L.ffn_norm, m.eps)
            h = h + L.ffn_down @ (gelu_math(L.ffn_gate @ x) * (L.ffn_up @ x))
        want = m.embedding @ hand_norm(h, m.final_norm, m.eps)
        assert got.shape == (1, 50)
        assert rel_err(got[0], want) < 1e-13


def hand_bf16(v):
    """Nearest bf16 to float32(v), ties to the even one, chosen between the
    two bf16 neighbours by their distances (not ref's bit trick)."""
    out = []
    for f in np.asarray(v, np.float32).ravel():
        bits = int(np.array(f).view(np.uint32))
        lo = np.array(bits & 0xFFFF0000, np.uint32).view(np.float32)
        hi = np.array((bits & 0xFFFF0000) + 0x10000, np.uint32).view(np.float32)
        dl, dh = abs(float(f) - float(lo)), abs(float(hi) - float(f))
        pick = lo if dl < dh or (dl == dh and not (bits >> 16) & 1) else hi
        out.append(float(pick))
    return np.array(out).reshape(np.shape(v))


def test_act_bf16_rounds_each_product_input_by_hand(tmp):
    m = build(tmp, "onebf", hidden=24, ff=40, layers=2, heads=4, kv_heads=2, head_dim=8, vocab=50,
              pattern="SF", seed=5)
    for tok in (0, 17, 49):
        got = ref.forward(m, [tok], act_bf16=True)
        h = m.embedding[tok].copy()
        for L in m.layers:
            x = hand_bf16(hand_norm(h, L.attn_norm, m.eps))
            v = (L.qkv @ x)[(m.n_heads + m.n_kv_heads) * m.head_dim:]
            g = 1.0 / (1.0 + np.exp(-(L.gate @ x)))
            o = np.concatenate([g[hh] * v[(hh // 2) * 8:(hh // 2) * 8 + 8] for hh in range(4)])
            h = h + L.out @ hand_bf16(o)  # the residual itself stays exact
            x = hand_bf16(hand_norm(h, L.ffn_norm, m.eps))
            h = h + L.ffn_down @ hand_bf16(gelu_math(L.ffn_gate @ x) * (L.ffn_up @ x))
        want = m.embedding @ hand_bf16(hand_norm(h, m.final_norm, m.eps))
        assert rel_err(got[0], want) < 1e-13
        assert rel_err(got[0], ref.forward(m, [tok])[0]) > 1e-4  # and it is not the exact forward


def test_bf16_rounding_amplifies_last_bit_differences(tmp):
    """The premise of the GPU's bf16-x prefill test (test_cuda.py): float32
    rounding-sized jitter before each rounding moves the rounded forward a good
    part of the rounding's own effect (so no fp32 implementation can be held
    close to the float64 rounded reference), while its distance from the
    exact forward stays what it was (so that distance can be)."""
    m = build(tmp, "jit", hidden=256, ff=512, layers=4, heads=4, kv_heads=2, head_dim=64, vocab=512,
              window=8, pattern="SSSF", seed=11)
    ids = [int(i) for i in np.random.default_rng(3).integers(0, 512, 40)]
    exact, rounded = ref.forward(m, ids), ref.forward(m, ids, act_bf16=True)
    rows = lambda a, b: np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)
    gap = rows(rounded, exact).mean()
    assert gap > 1e-3
    assert np.array_equal(ref.forward(m, ids, act_bf16=ref.bf16_inputs(0.0)), rounded)
    for seed in range(2):  # 1e-6: an fp32 GEMM's error on a 2048-long dot product, the size measured on the GPU
        jittered = ref.forward(m, ids, act_bf16=ref.bf16_inputs(1e-6, seed))
        assert rows(jittered, rounded).mean() > 0.3 * gap
        assert abs(rows(jittered, exact).mean() / gap - 1) < 0.05


def test_forward_many_tokens_matches_hand_loops(tmp):
    m = build(tmp, "loops", hidden=16, ff=24, layers=3, heads=4, kv_heads=1, head_dim=8, vocab=40,
              window=3, pattern="SFS", rope_factor_full=0.5, theta_full=500.0, theta_sliding=30.0, seed=6)
    ids = [3, 9, 1, 33, 7, 7, 20, 5, 0, 39]
    assert rel_err(ref.forward(m, ids), hand_forward(m, ids)) < 1e-12


def test_hidden_states_and_steering(tmp):
    m = build(tmp, "hid", layers=3, pattern="SSF", vocab=64, seed=7)
    ids = [1, 2, 3, 4, 5, 6]
    hs = ref.hidden_states(m, ids)
    assert hs.shape == (6, 3, 64)
    logits = ref.rmsnorm(hs[:, -1], m.final_norm, m.eps) @ m.embedding.T
    assert np.allclose(logits, ref.forward(m, ids), rtol=0, atol=1e-12)
    vec = np.random.default_rng(0).normal(size=64)
    # steering layer 2 (the last) adds exactly vec to the captured residual
    assert np.allclose(ref.hidden_states(m, ids, steer={2: vec})[:, 2], hs[:, 2] + vec, atol=1e-12)
    assert np.array_equal(ref.hidden_states(m, ids, steer={0: 0 * vec}), hs)
    assert np.array_equal(ref.forward(m, ids, steer=lambda i, h: h), ref.forward(m, ids))
    assert rel_err(ref.forward(m, ids, steer={0: vec}), ref.forward(m, ids)) > 1e-3


def test_causality_and_window_receptive_field(tmp):
    full = build(tmp, "full1", layers=1, pattern="F", vocab=64, seed=8)
    ids = list(range(10, 22))
    base = ref.forward(full, ids)
    changed = ids[:6] + [0] + ids[7:]
    after = ref.forward(full, changed)
    assert np.array_equal(base[:6], after[:6])  # the future never leaks back
    assert rel_err(after[11], base[11]) > 1e-4  # a full layer sees position 6 from 11

    # one sliding layer, window 4: position p sees p-3..p only
    slide = build(tmp, "slide1", layers=1, pattern="S", window=4, vocab=64, seed=8)
    base = ref.forward(slide, ids)
    p = 10
    far = ids[:p - 4] + [0] + ids[p - 3:]   # change position p-4: outside the window
    near = ids[:p - 3] + [0] + ids[p - 2:]  # change position p-3: inside
    assert np.array_equal(ref.forward(slide, far)[p], base[p])
    assert rel_err(ref.forward(slide, near)[p], base[p]) > 1e-4
    off = ref.forward(slide, ids, variant="window_off_by_one")
    assert rel_err(ref.forward(slide, far, variant="window_off_by_one")[p], off[p]) > 1e-4


def test_variants_each_change_logits(tmp):
    # two layer classes with very different rope (dims and theta), prompt 5x the window
    m = build(tmp, "var", layers=4, pattern="SF", window=4, head_dim=32, rope_factor_full=0.25,
              rope_factor_sliding=1.0, theta_full=5e6, theta_sliding=10.0, vocab=128, seed=9)
    ids = list(np.random.default_rng(4).integers(0, 128, 20))
    base = ref.forward(m, ids)
    assert np.array_equal(base, ref.forward(m, ids))
    # tanh GELU is a small drift (~3e-4 relative here); the other three are gross
    for v, least in (("rope_swap", 1e-2), ("gate_after_out", 1e-2), ("window_off_by_one", 1e-2),
                     ("tanh_gelu", 1e-5)):
        assert rel_err(ref.forward(m, ids, variant=v), base) > least, v
    with pytest.raises(ValueError):
        ref.forward(m, ids, variant="nope")


# ---------------------------------------------------------------- files

@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_hf_and_gguf_give_same_logits(tmp, dtype):
    shape = dict(hidden=32, ff=48, layers=4, heads=4, kv_heads=1, head_dim=16, vocab=96, window=5, seed=11,
                 dtype=dtype)
    d = tmp / f"same_{dtype}"
    mkmodel.make_model(d, gguf=tmp / f"same_{dtype}.gguf", **shape)
    hf2gguf.convert(d, tmp / f"conv_{dtype}.gguf")
    hf2gguf.convert(d, tmp / f"conv32_{dtype}.gguf", dtype="f32", alignment=64)
    ids = list(np.random.default_rng(5).integers(0, 96, 17))
    want = ref.forward(ref.load_model(d), ids)
    for f in (f"same_{dtype}.gguf", f"conv_{dtype}.gguf", f"conv32_{dtype}.gguf"):
        got = ref.forward(ref.load_model(tmp / f), ids)
        # only difference possible: rms_norm_eps stored as float32 in GGUF
        assert rel_err(got, want) < 1e-13, f
    assert (tmp / f"same_{dtype}.gguf").read_bytes() == (tmp / f"conv_{dtype}.gguf").read_bytes()


def test_sharded_and_alias_equal_unsharded(tmp):
    shape = dict(layers=3, vocab=80, seed=12, dtype="bf16")
    ids = [5, 1, 79, 40, 40, 2, 3, 8, 9, 10]
    one = ref.forward(build(tmp, "u", **shape), ids)
    assert np.array_equal(ref.forward(build(tmp, "s", shards=3, **shape), ids), one)
    idx = json.loads((tmp / "s" / "model.safetensors.index.json").read_text())
    assert sorted(set(idx["weight_map"].values())) == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    alias = build(tmp, "a", alias=True, **shape)
    names = ref.load_hf_tensors(tmp / "a")
    assert "model.embed_tokens.weight" in names and "model.layers.0.self_attn.o_proj.weight" in names
    assert np.array_equal(ref.forward(alias, ids), one)
    hf2gguf.convert(tmp / "a", tmp / "a.gguf")
    assert rel_err(ref.forward(ref.load_model(tmp / "a.gguf"), ids), one) < 1e-13  # eps is f32 in GGUF


def test_q8_0_gguf_dequantizes(tmp):
    import gguf.quants
    from gguf import GGMLQuantizationType as Q
    m = build(tmp, "q8", layers=2, vocab=64, seed=14, gguf=tmp / "q8.gguf", gguf_dtype="q8_0")
    g = ref.load_model(tmp / "q8.gguf")
    w = m.layers[1].ffn_down.astype(np.float32)
    want = gguf.quants.dequantize(gguf.quants.quantize(w, Q.Q8_0), Q.Q8_0)
    assert np.array_equal(g.layers[1].ffn_down, want)
    assert np.array_equal(g.layers[1].ffn_norm, m.layers[1].ffn_norm)  # norms stay F32
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    assert 1e-6 < rel_err(ref.forward(g, ids), ref.forward(m, ids)) < 2e-2


def test_untied_head(tmp):
    m = build(tmp, "untied", untied=True, layers=2, vocab=64, seed=13, gguf=tmp / "untied.gguf")
    assert not np.array_equal(m.head, m.embedding)
    ids = [1, 2, 3]
    g = ref.load_model(tmp / "untied.gguf")
    assert np.array_equal(g.head, m.head)
    assert rel_err(ref.forward(g, ids), ref.forward(m, ids)) < 1e-13


def test_gguf_keys_follow_spec(tmp):
    from gguf import GGUFReader
    cfg = mkmodel.make_model(None, gguf=tmp / "keys.gguf", layers=5, pattern="SSFSF", head_dim=32, heads=4,
                             kv_heads=2, rope_factor_full=0.5, rope_factor_sliding=1.0, theta_full=5e6,
                             theta_sliding=1e4, window=7, max_ctx=333, alignment=128, vocab=70)
    r = GGUFReader(str(tmp / "keys.gguf"))
    kv = {f.name: f.contents() for f in r.fields.values()}
    p = "spark2_5."
    assert kv["general.architecture"] == "spark2_5" and kv["general.alignment"] == 128
    assert kv[p + "attention.sliding_window_pattern"] == [True, True, False, True, False]  # true = sliding
    assert kv[p + "rope.freq_base"] == 5e6 and kv[p + "rope.freq_base_swa"] == 1e4  # freq_base = FULL theta
    assert kv[p + "rope.dimension_count"] == 16 and kv[p + "rope.dimension_count_swa"] == 32
    assert kv[p + "attention.key_length"] == 32 and kv[p + "attention.value_length"] == 32
    assert kv[p + "context_length"] == 333 and kv[p + "attention.sliding_window"] == 7
    assert kv[p + "vocab_size"] == 70 and kv[p + "block_count"] == 5
    assert kv["tokenizer.ggml.bos_token_id"] == 0 and kv["tokenizer.ggml.eos_token_id"] == 1
    t = {x.name: x for x in r.tensors}
    assert "output.weight" not in t  # tied
    assert t["blk.0.attn_gate.weight"].shape.tolist() == [64, 4]  # ne = [n_embd, n_head]
    assert t["blk.0.attn_qkv.weight"].shape.tolist() == [64, (4 + 2 * 2) * 32]
    assert t["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    assert cfg["layer_types"][2] == "full_attention"
    m = ref.load_model(tmp / "keys.gguf")
    assert m.sliding == [True, True, False, True, False] and m.rope_of(False) == (16, 5e6)


def test_config_refusals():
    good = mkmodel.build_config()
    ref.check_config(good)
    for key, bad in (("hidden_act", "gelu_pytorch_tanh"), ("gate_attn_act_mode", "tanh"),
                     ("attention_bias", True), ("layer_types", ["chunked_attention"] * 4)):
        with pytest.raises(ValueError):
            ref.check_config(dict(good, **{key: bad}))


def read_gguf_kv(path):
    """Minimal independent GGUF v3 metadata parser (the gguf package's reader is
    slow on 260k-string arrays): {key: value}, arrays as lists."""
    import struct
    raw = Path(path).read_bytes()
    assert raw[:4] == b"GGUF" and struct.unpack_from("<I", raw, 4)[0] == 3
    _, n_kv = struct.unpack_from("<QQ", raw, 8)
    off = 24
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def string():
        nonlocal off
        (n,) = struct.unpack_from("<Q", raw, off)
        off += 8 + n
        return raw[off - n:off].decode("utf-8")

    def value(t):
        nonlocal off
        if t == 8:
            return string()
        if t == 9:
            sub, n = struct.unpack_from("<IQ", raw, off)
            off += 12
            if sub in scalar:
                fmt = "<%d%s" % (n, scalar[sub])
                vals = list(struct.unpack_from(fmt, raw, off))
                off += struct.calcsize(fmt)
                return vals
            return [value(sub) for _ in range(n)]
        (v,) = struct.unpack_from("<" + scalar[t], raw, off)
        off += struct.calcsize(scalar[t])
        return v

    kv = {}
    for _ in range(n_kv):
        key = string()
        (t,) = struct.unpack_from("<I", raw, off)
        off += 4
        kv[key] = value(t)
    return kv


@pytest.mark.skipif(not (TOKENIZER_DIR / "tokenizer.json").exists(), reason="shared tokenizer not present")
def test_tokenizer_metadata(tmp):
    mkmodel.make_model(tmp / "tok", gguf=tmp / "tok.gguf", tokenizer=TOKENIZER_DIR, hidden=8, ff=8, layers=1,
                       heads=1, kv_heads=1, head_dim=8)
    cfg = json.loads((tmp / "tok" / "config.json").read_text())
    assert cfg["vocab_size"] == 131072 and (tmp / "tok" / "tokenizer.json").exists()
    kv = read_gguf_kv(tmp / "tok.gguf")
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "spark2_5"
    assert kv["tokenizer.ggml.add_bos_token"] is False
    tokens, types, merges = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"], kv["tokenizer.ggml.merges"]
    assert len(tokens) == len(types) == 131072 and len(merges) == 130716
    assert tokens[0] == "<｜start▁of▁sentence｜>" and types[0] == 3  # added + special: control
    assert tokens[130973] == "<|User|>" and types[130973] == 4    # added, not special: user-defined
    assert tokens[1046] == "The" and types[1046] == 1 and merges[0] == "Ġ Ġ"
    assert kv["spark2_5.attention.sliding_window_pattern"] == [True]


def test_cli_tools(tmp):
    env_py = [sys.executable]
    subprocess.run(env_py + [str(TOOLS / "mkmodel.py"), str(tmp / "cli"), "--layers", "2", "--vocab", "64",
                             "--pattern", "FS", "--dtype", "f16", "--gguf", str(tmp / "cli.gguf")], check=True)
    subprocess.run(env_py + [str(TOOLS / "hf2gguf.py"), str(tmp / "cli"), str(tmp / "cli2.gguf"),
                             "--dtype", "bf16"], check=True)
    m = ref.load_model(tmp / "cli")
    ids = [4, 8, 15, 16, 23, 42]
    want = ref.forward(m, ids)
    for src, extra, rows in ((tmp / "cli", ["--all"], slice(None)), (tmp / "cli.gguf", [], slice(-1, None))):
        out = tmp / "out.npy"
        subprocess.run(env_py + [str(TOOLS / "ref.py"), str(src), "--ids", ",".join(map(str, ids)),
                                 "--out", str(out)] + extra, check=True)
        got = np.load(out)
        assert got.dtype == np.float32 and got.shape == want[rows].shape
        assert np.allclose(got, want[rows], rtol=1e-6, atol=1e-5)
    assert ref.load_model(tmp / "cli2.gguf").layers[0].qkv.shape == m.layers[0].qkv.shape

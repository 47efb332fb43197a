#!/usr/bin/env python3
"""Independent float64 NumPy reference forward pass of Spark-X2.5 (`spark2_5`).

Written from SPEC.md section 2 only (never from the C code), so that the C
runtime can be checked against it. Everything is computed in float64; weights
are used exactly as stored (bf16/f16 upcast to float64 without rounding).

API (import with PYTHONPATH=tools):
    load_model(path) -> Model          HF directory, or a GGUF file
    forward(model, ids, steer=None, variant=None, kv=None, act_bf16=False) -> [n, vocab] float64 logits
    round_bf16(x), bf16_inputs(jitter, seed)   (act_bf16: every product's input rounded to bf16)
    hidden_states(model, ids, steer=None, variant=None) -> [n, layers, hidden]
    rope, rope_angles, attn_mask, window_mask, causal_mask, attention,
    rmsnorm, erf, gelu, gelu_tanh, sigmoid   (the small pieces, for unit tests)
    read_safetensors(file), load_hf_tensors(dir), hf_config(dir)

`kv` = (full_type, sliding_type) simulates a KV cache that stores keys and
values in a lossy format ("f32", "f16", "bf16", "tq2", "tq3", "tq3.5", "tq4"):
every key (after rope) and value row goes through kv_roundtrip before
attention, as spark.c's cache stores it. TurboQuant is written here from its
description (SPEC section 7, src/engine/kv_format.h's header), independently of the C
code: the Lloyd-Max codebooks are recomputed in float64, the rotation is the
seeded random-sign Walsh-Hadamard transform with the same seed and hash.

`variant` selects a deliberately broken model for quality-gate experiments:
    'rope_swap'          each layer class uses the other class's rope (dims, theta)
    'gate_after_out'     the head gate scales the out_proj output, not the heads
    'window_off_by_one'  sliding layers see keys with 0 <= p - j <= window
    'tanh_gelu'          tanh-approximated GELU instead of the erf form

CLI (same output contract as `spark logits`):
    python3 tools/ref.py MODEL --ids 12,7,99 --out FILE.npy [--all]
        [--variant V] [--f64] [--hidden-out FILE.npy]
writes float32 logits [n, vocab] with --all, else [1, vocab] (last position).
"""
import argparse
import json
import math
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

VARIANTS = (None, "rope_swap", "gate_after_out", "window_off_by_one", "tanh_gelu")
SLIDING, FULL = "sliding_attention", "full_attention"


# --------------------------------------------------------------------------
# small numeric pieces

_ERF_TAYLOR = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(30)]


def _exp_neg_square(x):
    """exp(-x*x) without the rounding error of forming x*x (Veltkamp split)."""
    hi = x * x
    big = x * 134217729.0  # 2^27 + 1
    xh = big - (big - x)
    xl = x - xh
    lo = ((xh * xh - hi) + 2.0 * xh * xl) + xl * xl
    return np.exp(-hi) * (1.0 - lo)


def erf(x):
    """Vectorised float64 erf, within ~2 ulp of libm's erf.

    |x| < 1: Maclaurin series in Horner form (little cancellation there).
    |x| >= 1: 1 - erfc(x), erfc from Laplace's continued fraction evaluated
    backwards; erfc is small there, so its relative error hardly matters."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    out = np.empty_like(a)
    small = a < 1.0
    xs = a[small]
    u = xs * xs
    p = np.full_like(xs, _ERF_TAYLOR[-1])
    for c in reversed(_ERF_TAYLOR[:-1]):
        p = p * u + c
    out[small] = (2.0 / math.sqrt(math.pi)) * (xs * p)
    xl = np.minimum(a[~small], 10.0)  # erf(10) == 1 in float64; also tames inf
    f = xl.copy()
    for k in range(200, 0, -1):
        f = xl + (k / 2.0) / f
    out[~small] = 1.0 - _exp_neg_square(xl) / (math.sqrt(math.pi) * f)
    return np.copysign(out, x)


def gelu(x):
    """Exact GELU: 0.5 x (1 + erf(x / sqrt 2))."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    """The tanh approximation of GELU (wrong for this model; a broken variant)."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def sigmoid(x):
    x = np.asarray(x, dtype=np.float64)
    # split by sign so exp never overflows
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def rmsnorm(x, w, eps):
    """y = w * x / sqrt(mean(x^2) + eps) over the last axis."""
    x = np.asarray(x, dtype=np.float64)
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rope_angles(pos, rot_dims, theta):
    """[n, R/2] angles pos * theta^(-2j/R) for j < R/2."""
    j = np.arange(rot_dims // 2, dtype=np.float64)
    inv = np.power(float(theta), -2.0 * j / rot_dims)
    return np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]


def rope(x, pos, rot_dims, theta):
    """NeoX (rotate-half) rope on the first rot_dims dims of every head.

    x: [n, heads, D]; pos: [n] absolute positions. Pairs are (j, j + R/2);
    dims R..D-1 are returned untouched."""
    x = np.asarray(x, dtype=np.float64)
    if rot_dims == 0:
        return x.copy()
    if rot_dims % 2 or rot_dims > x.shape[-1]:
        raise ValueError(f"rope: rotary dims {rot_dims} must be even and <= head_dim {x.shape[-1]}")
    half = rot_dims // 2
    ang = rope_angles(pos, rot_dims, theta)[:, None, :]  # broadcast over heads
    cos, sin = np.cos(ang), np.sin(ang)
    a, b = x[..., :half], x[..., half:rot_dims]
    out = x.copy()
    out[..., :half] = a * cos - b * sin
    out[..., half:rot_dims] = b * cos + a * sin
    return out


def causal_mask(n):
    """[n, n] bool, allowed[p, j] = j <= p."""
    p = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    return p - j >= 0


def window_mask(n, window):
    """[n, n] bool, allowed[p, j] = 0 <= p - j < window (itself + window-1 before)."""
    d = np.arange(n)[:, None] - np.arange(n)[None, :]
    return (d >= 0) & (d < window)


def attn_mask(n, sliding, window, variant=None):
    """The mask of one layer class; variant 'window_off_by_one' widens the window by one."""
    if not sliding:
        return causal_mask(n)
    if variant == "window_off_by_one":
        return window_mask(n, window + 1)
    return window_mask(n, window)


def kv_head_of(h, n_heads, n_kv_heads):
    """GQA: query head h reads kv head h // (H / Hk)."""
    return h // (n_heads // n_kv_heads)


def attention(q, k, v, mask, scale):
    """GQA softmax attention. q: [n, H, D]; k, v: [n, Hk, D]; mask: [n, n] bool.

    Returns [n, H, D]."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    if n_heads % n_kv:
        raise ValueError(f"attention: {n_heads} query heads not a multiple of {n_kv} kv heads")
    idx = kv_head_of(np.arange(n_heads), n_heads, n_kv)
    kh, vh = k[:, idx, :], v[:, idx, :]
    s = np.einsum("phd,jhd->hpj", q, kh) * scale
    s = np.where(mask[None, :, :], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    w = np.exp(s)
    w /= w.sum(axis=-1, keepdims=True)
    return np.einsum("hpj,jhd->phd", w, vh)


# --------------------------------------------------------------------------
# KV-cache formats (simulated)

KV_TYPES = ("f32", "f16", "bf16", "tq2", "tq3", "tq3.5", "tq4")
KV_TQ_SEED = 0x53504B5451554E54  # "SPKTQUNT"
_M64 = (1 << 64) - 1


def _splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def kv_signs(d):
    """The rotation's random signs: -1 where the top bit of splitmix64(seed + i) is set."""
    return np.array([-1.0 if _splitmix64(KV_TQ_SEED + i) >> 63 else 1.0 for i in range(d)])


_CODEBOOKS = {}


def lloyd_max_gaussian(bits, iters=200000):
    """Centroids (ascending) and distortion of the Lloyd-Max quantizer of N(0, 1)."""
    if bits in _CODEBOOKS:
        return _CODEBOOKS[bits]
    n = 1 << bits
    c = [-3.0 + 6.0 * (i + 0.5) / n for i in range(n)]
    pdf = lambda x: 0.0 if math.isinf(x) else math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = lambda x: 0.5 * math.erfc(-x / math.sqrt(2.0))
    for _ in range(iters):
        b = [-math.inf] + [(c[i] + c[i + 1]) / 2 for i in range(n - 1)] + [math.inf]
        new = [(pdf(b[i]) - pdf(b[i + 1])) / (cdf(b[i + 1]) - cdf(b[i])) for i in range(n)]
        done = max(abs(x - y) for x, y in zip(new, c)) < 1e-15
        c = new
        if done:
            break
    b = [-math.inf] + [(c[i] + c[i + 1]) / 2 for i in range(n - 1)] + [math.inf]
    p = [cdf(b[i + 1]) - cdf(b[i]) for i in range(n)]
    _CODEBOOKS[bits] = (np.array(c), 1.0 - sum(pi * ci * ci for pi, ci in zip(p, c)))
    return _CODEBOOKS[bits]


def fwht(x):
    """Unnormalised Walsh-Hadamard transform along the last axis (a power of two)."""
    x = np.array(x, dtype=np.float64)
    d = x.shape[-1]
    h = 1
    while h < d:
        y = x.reshape(x.shape[:-1] + (d // (2 * h), 2, h))
        a, b = y[..., 0, :].copy(), y[..., 1, :].copy()
        y[..., 0, :], y[..., 1, :] = a + b, a - b
        x = y.reshape(x.shape)
        h *= 2
    return x


def _tq_bits(kv_type, is_value):
    return {"tq2": 2, "tq3": 3, "tq3.5": 4 if is_value else 3, "tq4": 4}[kv_type]


def tq_roundtrip(x, bits, unbiased=True):
    """TurboQuant quantize + dequantize of rows x[..., d]: rotate (R = H S / sqrt d),
    standardise, nearest Lloyd-Max centroid, rescale (unbiased: the decoded row's
    component along x is exact), rotate back."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    c, _ = lloyd_max_gaussian(bits)
    bounds = (c[1:] + c[:-1]) / 2
    s = kv_signs(d)
    norm = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    y = fwht(x * s) / math.sqrt(d)
    safe = np.where(norm > 0, norm, 1.0)
    z = y * math.sqrt(d) / safe
    q = c[np.searchsorted(bounds, z, side="left")]
    zc = (z * q).sum(axis=-1, keepdims=True)
    scale = norm * math.sqrt(d) / np.where(zc > 0, zc, 1.0) if unbiased else norm / math.sqrt(d)
    rot = np.where(norm > 0, scale, 0.0) * q
    return fwht(rot) / math.sqrt(d) * s


def kv_roundtrip(x, kv_type, is_value):
    """What a cache of kv_type gives back for rows x[..., head_dim]."""
    if kv_type not in KV_TYPES:
        raise ValueError(f"unknown KV type {kv_type!r}; one of {KV_TYPES}")
    x32 = np.asarray(x, dtype=np.float64).astype(np.float32)  # the C cache stores float32 results
    if kv_type == "f32":
        return np.asarray(x, dtype=np.float64)
    if kv_type == "f16":
        return x32.astype(np.float16).astype(np.float64)
    if kv_type == "bf16":
        return round_bf16(x32)
    return tq_roundtrip(x, _tq_bits(kv_type, is_value))


# --------------------------------------------------------------------------
# the model

@dataclass
class Layer:
    attn_norm: np.ndarray
    qkv: np.ndarray       # [(H + 2 Hk) D, E]
    gate: np.ndarray      # [H, E]
    out: np.ndarray       # [E, H D]
    ffn_norm: np.ndarray
    ffn_gate: np.ndarray  # [F, E]
    ffn_up: np.ndarray    # [F, E]
    ffn_down: np.ndarray  # [E, F]


@dataclass
class Model:
    hidden: int
    ff: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    window: int
    sliding: list          # per layer: True = sliding_attention
    rope_dims_full: int
    rope_dims_swa: int
    theta_full: float
    theta_swa: float
    eps: float
    max_ctx: int
    embedding: np.ndarray  # [V, E]
    final_norm: np.ndarray
    layers: list
    head: np.ndarray = None  # [V, E]; the embedding when tied
    bos: int = 0
    eos: int = 1
    pad: int = 2
    source: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def n_layers(self):
        return len(self.layers)

    def rope_of(self, sliding):
        """(rot_dims, theta) of a layer class."""
        if sliding:
            return self.rope_dims_swa, self.theta_swa
        return self.rope_dims_full, self.theta_full


def round_bf16(x):
    """x (float64) as float32, then rounded to bf16 (nearest even), back as float64."""
    u = np.asarray(x, dtype=np.float64).astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return bf16_bits_to_f32(u.astype(np.uint16)).astype(np.float64)


def bf16_inputs(jitter=0.0, seed=0):
    """forward's act_bf16 as a function: each value rounded to bf16; with
    jitter, first multiplied by (1 + jitter * N(0, 1)), as the last-bit
    differences of an fp32 implementation would move it. Rounding is not
    continuous: a difference of one float32 ulp turns some elements to the
    other bf16 neighbour, and those flips compound layer by layer, so two
    correct implementations that round the same points land about half the
    rounding's own effect apart (bench/cuda_runs.md run 41)."""
    if not jitter:
        return round_bf16
    rng = np.random.default_rng(seed)
    return lambda t: round_bf16(np.asarray(t) * (1 + jitter * rng.standard_normal(np.shape(t))))


def _identity(t):
    return t


def _layer_forward(m, L, h, pos, sliding, variant, record=None, kv=None, rx=_identity):
    n = h.shape[0]
    H, Hk, D = m.n_heads, m.n_kv_heads, m.head_dim
    # rx: what each matrix product's input becomes (act_bf16)
    x = rx(rmsnorm(h, L.attn_norm, m.eps))
    qkv = x @ L.qkv.T
    g = sigmoid(x @ L.gate.T)  # [n, H], from the same normalised x
    q = qkv[:, :H * D].reshape(n, H, D)
    k = qkv[:, H * D:(H + Hk) * D].reshape(n, Hk, D)
    v = qkv[:, (H + Hk) * D:].reshape(n, Hk, D)
    rope_class = (not sliding) if variant == "rope_swap" else sliding
    R, theta = m.rope_of(rope_class)
    q, k = rope(q, pos, R, theta), rope(k, pos, R, theta)
    if kv is not None:  # what the cache holds: keys after rope, values
        kv_type = kv[1] if sliding else kv[0]
        k, v = kv_roundtrip(k, kv_type, 0), kv_roundtrip(v, kv_type, 1)
    o = attention(q, k, v, attn_mask(n, sliding, m.window, variant), D ** -0.5)
    if variant == "gate_after_out":
        # the broken order: project first, then scale slice e of the output by gate e*H//E
        proj = o.reshape(n, H * D) @ L.out.T
        which = np.arange(m.hidden) * H // m.hidden
        h = h + proj * g[:, which]
    else:
        o = o * g[:, :, None]  # one scalar per head, before out_proj
        h = h + rx(o.reshape(n, H * D)) @ L.out.T
    x = rx(rmsnorm(h, L.ffn_norm, m.eps))
    act = gelu_tanh if variant == "tanh_gelu" else gelu
    a = act(x @ L.ffn_gate.T) * (x @ L.ffn_up.T)
    if record is not None:
        record.append(a)  # the gated FFN activation, for the statistics hook
    return h + rx(a) @ L.ffn_down.T


def steer_modes(directions, mode, strength):
    """The issue's steering modes as an f(layer, h) for `steer=`: per layer a
    direction d (rows of `directions`; a zero row leaves the layer alone),
    u = d/|d|, strength a:  add h + a d;  ablate h - a (h.u) u;
    clamp h + (a - h.u) u;  renorm h' = h - (h.u) u, scaled back to |h|."""
    def f(layer, h):
        v = np.asarray(directions[layer], dtype=np.float64)
        if not v.any():
            return h
        u = v / np.linalg.norm(v)
        proj = h @ u
        if mode == "add":
            return h + strength * v
        if mode == "ablate":
            return h - strength * proj[:, None] * u
        if mode == "clamp":
            return h + (strength - proj)[:, None] * u
        if mode != "renorm":
            raise ValueError(f"unknown steering mode {mode!r}")
        hp = h - proj[:, None] * u
        return hp * (np.linalg.norm(h, axis=1) / np.linalg.norm(hp, axis=1))[:, None]
    return f


def _apply_steer(steer, i, h):
    """steer: None; {layer: vector} added to the residual; or f(layer, h) -> h."""
    if steer is None:
        return h
    if callable(steer):
        return np.asarray(steer(i, h), dtype=np.float64)
    if i in steer:
        return h + np.asarray(steer[i], dtype=np.float64)
    return h


def _run(m, ids, steer, variant, capture, record=None, kv=None, rx=_identity):
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {VARIANTS}")
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise ValueError("empty prompt")
    if ids.min() < 0 or ids.max() >= m.vocab:
        raise ValueError(f"token id out of range [0, {m.vocab})")
    pos = np.arange(ids.size)
    h = m.embedding[ids].astype(np.float64)  # no scaling, no norm
    states = []
    for i, L in enumerate(m.layers):
        h = _layer_forward(m, L, h, pos, m.sliding[i], variant, record, kv, rx)
        h = _apply_steer(steer, i, h)  # steering acts after the FFN add
        if capture:
            states.append(h)
    return h, states


def forward(model, ids, steer=None, variant=None, kv=None, act_bf16=False):
    """Raw logits [n, vocab] (float64) for every position of ids (positions from 0).

    steer: None, {layer_index: vector[hidden]} added to the residual after that
    layer's FFN add, or a callable f(layer_index, h[n, hidden]) -> new h.
    kv: None (exact), or (full_type, sliding_type) of a simulated KV cache.
    act_bf16: every matrix product's input rounded to bf16 first (SPEC §2:
    the published reference's own precision; the residual stays float64);
    True, or a function from bf16_inputs."""
    rx = act_bf16 if callable(act_bf16) else round_bf16 if act_bf16 else _identity
    h, _ = _run(model, ids, steer, variant, capture=False, kv=kv, rx=rx)
    h = rmsnorm(h, model.final_norm, model.eps)
    return rx(h) @ model.head.T  # no softcap, no scale


def hidden_states(model, ids, steer=None, variant=None):
    """[n, layers, hidden]: the residual after each layer's FFN add (after steering)."""
    _, states = _run(model, ids, steer, variant, capture=True)
    return np.stack(states, axis=1)


def ffn_activations(model, ids, steer=None):
    """[layers, n, ff]: gelu(gate x) * (up x) of every layer and position."""
    record = []
    _run(model, ids, steer, None, capture=False, record=record)
    return np.stack(record, axis=0)


# --------------------------------------------------------------------------
# loading: safetensors (own reader, so bf16 needs no torch)

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def bf16_bits_to_f32(u16):
    """uint16 bf16 bit patterns -> float32, exactly."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path):
    """{name: (array, dtype_tag)} from one .safetensors file.

    dtype_tag is 'F32' | 'F16' | 'BF16' | 'F64'; bf16 tensors come back as
    float32 arrays holding exactly the stored values."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if 8 + hlen > len(raw):
        raise ValueError(f"{path}: header length {hlen} past end of file")
    header = json.loads(raw[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tag = info["dtype"]
        if tag not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {tag}")
        start, end = info["data_offsets"]
        if base + end > len(raw):
            raise ValueError(f"{path}: tensor {name}: data past end of file")
        arr = np.frombuffer(raw, dtype=_ST_DTYPES[tag], count=(end - start) // np.dtype(_ST_DTYPES[tag]).itemsize,
                            offset=base + start).reshape(info["shape"])
        if tag == "BF16":
            arr = bf16_bits_to_f32(arr)
        out[name] = (arr, tag)
    return out


def load_hf_tensors(hf_dir):
    """{name: (array, dtype_tag)} from model.safetensors or the shards of an index."""
    d = Path(hf_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (d / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{d}: no model.safetensors or model.safetensors.index.json")
    tensors = {}
    for f in files:
        for name, val in read_safetensors(d / f).items():
            if name in tensors:
                raise ValueError(f"{d}: tensor {name} appears in two shards")
            tensors[name] = val
    return tensors


def hf_config(hf_dir):
    return json.loads((Path(hf_dir) / "config.json").read_text())


def check_config(cfg):
    """Refuse configs that break an assumption of SPEC section 2."""
    def need(cond, what):
        if not cond:
            raise ValueError(f"config.json: unsupported: {what}")
    need(cfg.get("hidden_act", "gelu") == "gelu", f"hidden_act {cfg.get('hidden_act')!r} (need exact 'gelu')")
    need(cfg.get("gate_attn_act_mode", "sigmoid") == "sigmoid", f"gate_attn_act_mode {cfg.get('gate_attn_act_mode')!r}")
    need(cfg.get("headwise_attn_output_gate", True) is True, "headwise_attn_output_gate must be true")
    need(not cfg.get("attention_bias", False), "attention_bias")
    need(not cfg.get("mlp_bias", False), "mlp_bias")
    for t in cfg["layer_types"]:
        need(t in (SLIDING, FULL), f"layer type {t!r}")
    need(len(cfg["layer_types"]) == cfg["num_hidden_layers"], "len(layer_types) != num_hidden_layers")


def _rot_dims(head_dim, factor):
    r = head_dim * float(factor)
    if r != int(r) or int(r) % 2:
        raise ValueError(f"rotary dims head_dim*factor = {r} is not an even integer")
    return int(r)


def _f64(a):
    return np.asarray(a, dtype=np.float64)


# aliases other converters write (SPEC section 3)
_HF_ALIASES = {"model.embed_tokens.weight": "model.embedding.weight"}


def canonical_hf_name(name):
    name = _HF_ALIASES.get(name, name)
    return name.replace(".self_attn.o_proj.", ".self_attn.out_proj.")


def _load_hf(path):
    cfg = hf_config(path)
    check_config(cfg)
    tensors = {canonical_hf_name(k): v[0] for k, v in load_hf_tensors(path).items()}

    def t(name):
        if name not in tensors:
            raise KeyError(f"{path}: missing tensor {name}")
        return _f64(tensors[name])

    layers = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        layers.append(Layer(
            attn_norm=t(p + "input_layernorm.weight"), qkv=t(p + "self_attn.q_k_v_proj.weight"),
            gate=t(p + "self_attn.g_proj.weight"), out=t(p + "self_attn.out_proj.weight"),
            ffn_norm=t(p + "post_attention_layernorm.weight"), ffn_gate=t(p + "mlp.gate_proj.weight"),
            ffn_up=t(p + "mlp.up_proj.weight"), ffn_down=t(p + "mlp.down_proj.weight")))
    emb = t("model.embedding.weight")
    tied = cfg.get("tie_word_embeddings", True)
    if not tied and "lm_head.weight" not in tensors:
        raise ValueError(f"{path}: untied head but no lm_head.weight")
    head = emb if tied else t("lm_head.weight")
    rp = cfg["rope_parameters"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return Model(
        hidden=cfg["hidden_size"], ff=cfg["intermediate_size"], n_heads=cfg["num_attention_heads"],
        n_kv_heads=cfg["num_key_value_heads"], head_dim=D, vocab=cfg["vocab_size"],
        window=cfg["sliding_window"], sliding=[lt == SLIDING for lt in cfg["layer_types"]],
        rope_dims_full=_rot_dims(D, rp[FULL].get("partial_rotary_factor", 1.0)),
        rope_dims_swa=_rot_dims(D, rp[SLIDING].get("partial_rotary_factor", 1.0)),
        theta_full=float(rp[FULL]["rope_theta"]), theta_swa=float(rp[SLIDING]["rope_theta"]),
        eps=float(cfg["rms_norm_eps"]), max_ctx=cfg.get("max_position_embeddings", 0),
        embedding=emb, final_norm=t("model.norm.weight"), layers=layers, head=head,
        bos=cfg.get("bos_token_id", 0), eos=cfg.get("eos_token_id", 1), pad=cfg.get("pad_token_id", 2),
        source=str(path), extra={"config": cfg})


# --------------------------------------------------------------------------
# loading: GGUF

def gguf_tensor_f32(t):
    """Dequantize one GGUFReader tensor to float32 in [out, in] (row-major) shape."""
    from gguf import GGMLQuantizationType as Q
    import gguf.quants
    shape = tuple(int(s) for s in reversed(t.shape))
    if t.tensor_type == Q.F32:
        a = np.asarray(t.data, dtype=np.float32)
    elif t.tensor_type == Q.F16:
        a = np.asarray(t.data).view(np.float16).astype(np.float32)
    elif t.tensor_type == Q.BF16:
        a = bf16_bits_to_f32(np.asarray(t.data).view(np.uint16))
    else:
        a = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)  # Q8_0, Q4_K, Q6_K, ...
    return a.reshape(shape)


def _load_gguf(path):
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    kv = {f.name: f.contents() for f in r.fields.values()}
    arch = kv.get("general.architecture")
    if arch != "spark2_5":
        raise ValueError(f"{path}: general.architecture is {arch!r}, not 'spark2_5'")

    def key(k, default=None):
        full = "spark2_5." + k
        if full not in kv:
            if default is None:
                raise KeyError(f"{path}: missing key {full}")
            return default
        return kv[full]

    tensors = {t.name: t for t in r.tensors}

    def t(name):
        if name not in tensors:
            raise KeyError(f"{path}: missing tensor {name}")
        return _f64(gguf_tensor_f32(tensors[name]))

    n_layers = key("block_count")
    pattern = key("attention.sliding_window_pattern")  # TRUE = sliding
    if len(pattern) != n_layers:
        raise ValueError(f"{path}: sliding_window_pattern has {len(pattern)} entries, {n_layers} layers")
    layers = []
    for i in range(n_layers):
        p = f"blk.{i}."
        layers.append(Layer(
            attn_norm=t(p + "attn_norm.weight"), qkv=t(p + "attn_qkv.weight"), gate=t(p + "attn_gate.weight"),
            out=t(p + "attn_output.weight"), ffn_norm=t(p + "ffn_norm.weight"), ffn_gate=t(p + "ffn_gate.weight"),
            ffn_up=t(p + "ffn_up.weight"), ffn_down=t(p + "ffn_down.weight")))
    emb = t("token_embd.weight")
    head = t("output.weight") if "output.weight" in tensors else emb
    D = key("attention.key_length")
    return Model(
        hidden=key("embedding_length"), ff=key("feed_forward_length"), n_heads=key("attention.head_count"),
        n_kv_heads=key("attention.head_count_kv"), head_dim=D, vocab=emb.shape[0],
        window=key("attention.sliding_window"), sliding=[bool(b) for b in pattern],
        rope_dims_full=key("rope.dimension_count"), rope_dims_swa=key("rope.dimension_count_swa"),
        theta_full=float(key("rope.freq_base")), theta_swa=float(key("rope.freq_base_swa")),
        eps=float(key("attention.layer_norm_rms_epsilon")), max_ctx=key("context_length", 0),
        embedding=emb, final_norm=t("output_norm.weight"), layers=layers, head=head,
        bos=kv.get("tokenizer.ggml.bos_token_id", 0), eos=kv.get("tokenizer.ggml.eos_token_id", 1),
        pad=kv.get("tokenizer.ggml.padding_token_id", 2), source=str(path), extra={"gguf_kv": kv})


def load_model(path):
    """A Model from an HF directory (config.json + safetensors) or a GGUF file."""
    p = Path(path)
    if p.is_dir():
        return _load_hf(p)
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return _load_gguf(p)
    raise ValueError(f"{p}: neither an HF directory nor a GGUF file")


# --------------------------------------------------------------------------
# CLI

def parse_ids(text):
    try:
        return [int(s) for s in text.split(",") if s.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ids wants comma-separated integers, got {text!r}")


def main(argv=None):
    ap = argparse.ArgumentParser(description="float64 NumPy reference logits of a spark2_5 model")
    ap.add_argument("model", help="HF directory or GGUF file")
    ap.add_argument("--ids", required=True, type=parse_ids, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help="output .npy file")
    ap.add_argument("--all", action="store_true", help="logits of every position, else the last one")
    ap.add_argument("--variant", choices=[v for v in VARIANTS if v], default=None)
    ap.add_argument("--f64", action="store_true", help="write float64 instead of float32")
    ap.add_argument("--hidden-out", help="also write hidden states [n, layers, hidden] to this .npy")
    ap.add_argument("--kv-full", choices=KV_TYPES, default="f32", help="simulated KV format of full layers")
    ap.add_argument("--kv-sliding", choices=KV_TYPES, default="f32", help="simulated KV format of sliding layers")
    a = ap.parse_args(argv)
    m = load_model(a.model)
    dt = np.float64 if a.f64 else np.float32
    kv = None if (a.kv_full, a.kv_sliding) == ("f32", "f32") else (a.kv_full, a.kv_sliding)
    logits = forward(m, a.ids, variant=a.variant, kv=kv)
    np.save(a.out, (logits if a.all else logits[-1:]).astype(dt))
    if a.hidden_out:
        np.save(a.hidden_out, hidden_states(m, a.ids, variant=a.variant).astype(dt))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, KeyError, OSError) as e:  # a clean one-line error, not a traceback
        print(f"ref.py: error: {e}", file=sys.stderr)
        sys.exit(1)

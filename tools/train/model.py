"""spark2_5 in PyTorch, written from SPEC §2, for training and checking spark-tiny.

One module, read top to bottom like SPEC §2:
  h = embedding[token]
  per layer: x = rmsnorm(h); qkv = fused projection (rows q, then k, then v);
             g = sigmoid(g_proj(x)) one scalar per query head; NeoX partial rope on the
             first R dims of each head with the layer class's (R, theta);
             GQA attention (causal for full layers, 0 <= p-j < window for sliding ones);
             o[h] *= g[h] BEFORE out_proj; h += out_proj(o);
             h += down(gelu_erf(gate(rmsnorm(h))) * up(rmsnorm(h)))
  logits = rmsnorm(h) @ embedding^T  (tied head)
Tensor names match the Hugging Face checkpoint (SPEC §3), so a state_dict saves as-is.

Also here: reading/writing the HF directory (config.json + model.safetensors), the
teacher-forced perplexity protocol that the quality gate uses, and greedy decoding.
Training-only extras (dropout) are off unless asked for and never change the
inference function.
"""
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass
class SparkConfig:
    vocab_size: int = 6144
    hidden_size: int = 256
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 1
    head_dim: int = 128
    sliding_window: int = 64
    layer_types: list = field(default_factory=lambda: ([SLIDING] * 3 + [FULL]) * 2)
    rope_full_theta: float = 5e6
    rope_full_factor: float = 0.25
    rope_sliding_theta: float = 1e4
    rope_sliding_factor: float = 1.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02

    def rope_for(self, layer_type):
        """(rotary dims R, theta) of a layer class."""
        if layer_type == FULL:
            return int(self.head_dim * self.rope_full_factor), self.rope_full_theta
        return int(self.head_dim * self.rope_sliding_factor), self.rope_sliding_theta

    def to_hf(self):
        """The config.json of a real spark2_5 checkpoint (field names as in the 4B's)."""
        return {
            "architectures": ["Spark2_5ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 0,
            "dtype": "bfloat16",
            "eos_token_id": 1,
            "gate_attn_act_mode": "sigmoid",
            "head_dim": self.head_dim,
            "headwise_attn_output_gate": True,
            "hidden_act": "gelu",
            "hidden_size": self.hidden_size,
            "initializer_range": self.initializer_range,
            "intermediate_size": self.intermediate_size,
            "layer_types": list(self.layer_types),
            "max_position_embeddings": self.max_position_embeddings,
            "mlp_bias": False,
            "model_type": "spark2_5",
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "pad_token_id": 2,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {
                FULL: {"partial_rotary_factor": self.rope_full_factor,
                       "rope_theta": self.rope_full_theta},
                SLIDING: {"partial_rotary_factor": self.rope_sliding_factor,
                          "rope_theta": self.rope_sliding_theta},
            },
            "sliding_window": self.sliding_window,
            "tie_word_embeddings": True,
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }

    @classmethod
    def from_hf(cls, d):
        # Refuse what this implementation does not compute rather than guess (SPEC §1).
        assert d.get("model_type") == "spark2_5", d.get("model_type")
        assert d.get("hidden_act") == "gelu" and d.get("gate_attn_act_mode") == "sigmoid"
        assert d.get("headwise_attn_output_gate") and d.get("tie_word_embeddings")
        assert not d.get("attention_bias") and not d.get("mlp_bias")
        rp = d["rope_parameters"]
        return cls(vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
                   intermediate_size=d["intermediate_size"],
                   num_hidden_layers=d["num_hidden_layers"],
                   num_attention_heads=d["num_attention_heads"],
                   num_key_value_heads=d["num_key_value_heads"], head_dim=d["head_dim"],
                   sliding_window=d["sliding_window"], layer_types=list(d["layer_types"]),
                   rope_full_theta=float(rp[FULL]["rope_theta"]),
                   rope_full_factor=float(rp[FULL]["partial_rotary_factor"]),
                   rope_sliding_theta=float(rp[SLIDING]["rope_theta"]),
                   rope_sliding_factor=float(rp[SLIDING]["partial_rotary_factor"]),
                   rms_norm_eps=d["rms_norm_eps"],
                   max_position_embeddings=d["max_position_embeddings"],
                   initializer_range=d.get("initializer_range", 0.02))


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in fp32 whatever the input dtype."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.float() * y


def rope_tables(n_pos, rot_dims, theta, device):
    """cos/sin [n_pos, R/2] for angle = pos * theta^(-2j/R); made in fp64 for accuracy."""
    j = torch.arange(rot_dims // 2, dtype=torch.float64, device=device)
    inv_freq = theta ** (-2.0 * j / rot_dims)
    ang = torch.arange(n_pos, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin, rot_dims):
    """NeoX (rotate-half) rope on the first R dims of each head; x: [B, heads, T, D].

    Pairs are (j, j + R/2); dims R..D-1 pass through untouched."""
    half = rot_dims // 2
    x1 = x[..., :half].float()
    x2 = x[..., half:rot_dims].float()
    c, s = cos[None, None], sin[None, None]
    r1 = x1 * c - x2 * s
    r2 = x2 * c + x1 * s
    return torch.cat([r1.to(x.dtype), r2.to(x.dtype), x[..., rot_dims:]], dim=-1)


def attention_mask(n_pos, layer_type, window, device):
    """Boolean [T, T], True where query p may read key j."""
    p = torch.arange(n_pos, device=device)[:, None]
    j = torch.arange(n_pos, device=device)[None, :]
    d = p - j
    if layer_type == FULL:
        return d >= 0
    return (d >= 0) & (d < window)


class Attention(nn.Module):
    def __init__(self, cfg, layer_type):
        super().__init__()
        self.cfg, self.layer_type = cfg, layer_type
        H, Hk, D, E = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.q_k_v_proj = nn.Linear(E, (H + 2 * Hk) * D, bias=False)
        self.g_proj = nn.Linear(E, H, bias=False)
        self.out_proj = nn.Linear(H * D, E, bias=False)
        self.rot_dims, self.theta = cfg.rope_for(layer_type)

    def forward(self, x, cos, sin, mask):
        cfg = self.cfg
        B, T, _ = x.shape
        H, Hk, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qkv = self.q_k_v_proj(x)
        q, k, v = qkv.split([H * D, Hk * D, Hk * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, Hk, D).transpose(1, 2)
        v = v.view(B, T, Hk, D).transpose(1, 2)
        q = apply_rope(q, cos, sin, self.rot_dims)
        k = apply_rope(k, cos, sin, self.rot_dims)
        # enable_gqa: query head h reads kv head h // (H / Hk), as SPEC §2 says.
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=D ** -0.5,
                                           enable_gqa=(H != Hk))
        g = torch.sigmoid(self.g_proj(x))                 # [B, T, H], from the same x
        o = o.transpose(1, 2) * g[..., None].to(o.dtype)  # gate whole heads, before out_proj
        return self.out_proj(o.reshape(B, T, H * D))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        E, F_ = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(E, F_, bias=False)
        self.up_proj = nn.Linear(E, F_, bias=False)
        self.down_proj = nn.Linear(F_, E, bias=False)

    def forward(self, x):
        # F.gelu's default is the exact erf form; the tanh approximation is a known trap.
        return self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg, layer_type, dropout):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_type)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(dropout)

    def forward(self, h, cos, sin, mask):
        dt = self.self_attn.q_k_v_proj.weight.dtype
        x = self.input_layernorm(h).to(dt)
        h = h + self.drop(self.self_attn(x, cos, sin, mask)).float()
        x = self.post_attention_layernorm(h).to(dt)
        return h + self.drop(self.mlp(x)).float()


class Inner(nn.Module):
    """The `model.` prefix of the HF names."""

    def __init__(self, cfg, dropout):
        super().__init__()
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg, t, dropout) for t in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class SparkModel(nn.Module):
    def __init__(self, cfg, dropout=0.0):
        super().__init__()
        assert len(cfg.layer_types) == cfg.num_hidden_layers
        assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
        self.cfg = cfg
        self.model = Inner(cfg, dropout)
        self._tables = {}

    def init_weights(self, seed):
        """Normal(0, initializer_range); residual outputs scaled down by sqrt(2 L)."""
        gen = torch.Generator().manual_seed(seed)
        std = self.cfg.initializer_range
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
                continue
            s = std / math.sqrt(2 * self.cfg.num_hidden_layers) if name.endswith(
                ("out_proj.weight", "down_proj.weight")) else std
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * s)

    def tables(self, T, device):
        """Rope tables per layer class and masks, cached per (T, device)."""
        key = (T, str(device))
        if key not in self._tables:
            out = {}
            for lt in (FULL, SLIDING):
                R, theta = self.cfg.rope_for(lt)
                cos, sin = rope_tables(T, R, theta, device)
                out[lt] = (cos, sin, attention_mask(T, lt, self.cfg.sliding_window, device))
            self._tables[key] = out
        return self._tables[key]

    def hidden(self, ids):
        """Final normed hidden states [B, T, E] in fp32; the residual stream stays fp32."""
        T = ids.shape[1]
        tabs = self.tables(T, ids.device)
        h = self.model.embedding(ids).float()
        for layer in self.model.layers:
            cos, sin, mask = tabs[layer.layer_type]
            h = layer(h, cos, sin, mask)
        return self.model.norm(h)

    def forward(self, ids):
        h = self.hidden(ids)
        w = self.model.embedding.weight
        return h.to(w.dtype) @ w.t()


# ---------------------------------------------------------------- checkpoint I/O

def state_for_export(model):
    """bf16 tensors under the HF names; the tied head is not stored."""
    return {k: v.detach().to(torch.bfloat16).contiguous().cpu()
            for k, v in model.state_dict().items()}


def save_hf(model, outdir):
    from safetensors.torch import save_file
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    save_file(state_for_export(model), str(outdir / "model.safetensors"), metadata={"format": "pt"})
    (outdir / "config.json").write_text(json.dumps(model.cfg.to_hf(), indent=2) + "\n")


def load_hf(path, dtype=torch.float32, device="cpu"):
    """SparkModel from an HF directory, weights upcast from bf16 to `dtype`."""
    from safetensors.torch import load_file
    path = Path(path)
    cfg = SparkConfig.from_hf(json.loads((path / "config.json").read_text()))
    model = SparkModel(cfg)
    sd = load_file(str(path / "model.safetensors"))
    model.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True)
    return model.to(device=device, dtype=dtype).eval()


# ---------------------------------------------------------------- evaluation

PPL_PROTOCOL = (
    "Tokenize the held-out text (models/spark-tiny/heldout.txt, UTF-8) with the model's "
    "tokenizer.json as one string, no BOS or other token added. Cut the id stream into "
    "consecutive non-overlapping windows of CTX tokens: window k = ids[k*CTX:(k+1)*CTX] "
    "(the last one may be shorter; one of fewer than 2 tokens is dropped). Run each window "
    "on its own from position 0 (fresh context, rope positions 0..len-1). Score every "
    "position t>=1 of the window: nll = logsumexp(logits[t-1]) - logits[t-1][ids[t]]. The "
    "first token of each window is context only. ppl = exp(sum of nll / count), over all "
    "windows. Weights: the bf16 checkpoint upcast to fp32; all arithmetic fp32 (no TF32).")


@torch.no_grad()
def window_nll(model, ids, ctx, device, max_windows=None, batch=16):
    """Per-window (start, n_scored, nll_sum) under PPL_PROTOCOL; ids: 1-D LongTensor."""
    n = ids.numel()
    starts = [s for s in range(0, n, ctx) if min(ctx, n - s) >= 2]
    if max_windows is not None:
        starts = starts[:max_windows]
    out = []
    # Full windows batch together; a short last window runs alone.
    full = [s for s in starts if s + ctx <= n]
    rest = [s for s in starts if s + ctx > n]
    for i in range(0, len(full), batch):
        grp = full[i:i + batch]
        x = torch.stack([ids[s:s + ctx] for s in grp]).to(device)
        logits = model(x).float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        nll = -lp.gather(-1, x[:, 1:, None])[..., 0].double().sum(-1)
        out += [(s, ctx - 1, float(v)) for s, v in zip(grp, nll.cpu())]
    for s in rest:
        x = ids[s:].to(device)[None]
        logits = model(x).float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        nll = -lp.gather(-1, x[:, 1:, None])[..., 0].double().sum()
        out.append((s, x.shape[1] - 1, float(nll)))
    return out


def ppl_of(windows):
    tot = sum(w[2] for w in windows)
    cnt = sum(w[1] for w in windows)
    return math.exp(tot / cnt), tot / cnt, cnt


@torch.no_grad()
def greedy(model, prompt_ids, n_new, device):
    """Greedy continuation, full recompute each step (no cache: the reference should be
    obviously right, not fast). Returns (new ids, top1-top2 logit margins)."""
    ids = list(prompt_ids)
    new, margins = [], []
    for _ in range(n_new):
        x = torch.tensor([ids], device=device)
        logits = model(x)[0, -1].float()
        top = torch.topk(logits, 2)
        nxt = int(top.indices[0])
        margins.append(float(top.values[0] - top.values[1]))
        new.append(nxt)
        ids.append(nxt)
    return new, margins


@torch.no_grad()
def sample(model, prompt_ids, n_new, device, temperature=1.0, top_p=0.95, seed=0):
    """Nucleus sampling (the generation_config defaults), for a human-readable sample."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = list(prompt_ids)
    for _ in range(n_new):
        window = ids[-model.cfg.max_position_embeddings:]
        logits = model(torch.tensor([window], device=device))[0, -1].float().cpu() / temperature
        probs = torch.softmax(logits, -1)
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, 0) - sp < top_p
        sp = sp * keep
        nxt = int(si[torch.multinomial(sp / sp.sum(), 1, generator=gen)])
        ids.append(nxt)
        if nxt == 1:
            break
    return ids[len(prompt_ids):]

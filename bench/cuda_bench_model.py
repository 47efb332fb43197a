"""Write a large synthetic bf16 spark2_5 checkpoint quickly, for timing only.

tools/mkmodel.py draws every weight separately, which takes minutes for the
4B shape (4.1e9 normals). For bandwidth timing the values only have to be
real numbers of the right scale (never zeros: they make kernels look faster),
so this draws one 64 MB pool of N(0, 1) bf16 values and fills each tensor with
slices of it, scaled by a power of two (exact in bf16) near 1/sqrt(fan_in).
config.json comes from mkmodel.build_config, so the shape rules are the same.

    python3 bench/cuda_bench_model.py DIR --hidden 2560 --ff 10240 --layers 36 \
        --heads 16 --kv-heads 4 --head-dim 256 --vocab 131072 --window 512 --max-ctx 40960
"""
import argparse
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import mkmodel  # noqa: E402

POOL = 32 << 20  # values


def bf16_bits(a):
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    for k in ("hidden", "ff", "layers", "heads", "kv_heads", "head_dim", "vocab", "window", "max_ctx"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, required=True)
    a = ap.parse_args()
    shape = {k: getattr(a, k) for k in ("hidden", "ff", "layers", "heads", "kv_heads", "head_dim", "vocab", "window",
                                        "max_ctx")}
    cfg = mkmodel.build_config(dtype="bf16", **shape)
    rng = np.random.default_rng(0)
    pool = bf16_bits(rng.standard_normal(POOL, dtype=np.float32))
    E, F, V = a.hidden, a.ff, a.vocab
    H, Hk, D = a.heads, a.kv_heads, a.head_dim

    def mat(rows, cols):
        # scale by 2^-k: subtract k from the bf16 exponent field (values stay normal)
        k = int(round(math.log2(math.sqrt(cols))))
        return rows * cols, k

    tensors = [("model.embedding.weight", (V, E), mat(V, E))]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        tensors += [(p + "input_layernorm.weight", (E,), None),
                    (p + "self_attn.q_k_v_proj.weight", ((H + 2 * Hk) * D, E), mat((H + 2 * Hk) * D, E)),
                    (p + "self_attn.g_proj.weight", (H, E), mat(H, E)),
                    (p + "self_attn.out_proj.weight", (E, H * D), mat(E, H * D)),
                    (p + "post_attention_layernorm.weight", (E,), None),
                    (p + "mlp.gate_proj.weight", (F, E), mat(F, E)),
                    (p + "mlp.up_proj.weight", (F, E), mat(F, E)),
                    (p + "mlp.down_proj.weight", (E, F), mat(E, F))]
    tensors.append(("model.norm.weight", (E,), None))

    header, off = {}, 0
    for name, shp, _ in tensors:
        n = int(np.prod(shp))
        header[name] = {"dtype": "BF16", "shape": list(shp), "data_offsets": [off, off + 2 * n]}
        off += 2 * n
    header["__metadata__"] = {"format": "pt"}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    d = Path(a.out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    start, scaled_pools = 0, {}
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for name, shp, m in tensors:
            n = int(np.prod(shp))
            if m is None:  # norms: 1 + small noise
                f.write(bf16_bits(1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).tobytes())
                continue
            k = m[1]
            if k not in scaled_pools:  # exponent field minus k; zero stays zero
                scaled_pools[k] = np.where(pool & 0x7F80, pool - np.uint16(k << 7), pool).astype(np.uint16)
            scaled = scaled_pools[k]
            left = n
            while left:
                take = min(left, POOL - start)
                f.write(scaled[start:start + take].tobytes())
                start = (start + take) % POOL
                left -= take
    print(f"wrote {d} ({off / 1e9:.2f} GB of weights)")


if __name__ == "__main__":
    main()

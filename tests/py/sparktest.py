"""Helpers shared by the Python tests: run the spark binary, make models."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SPARK_BIN = os.environ.get("SPARK_BIN", str(ROOT / "build" / "spark"))
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")

# The synthetic shapes the CPU forward (test_forward.py) and the GPU
# (test_cuda.py) are both checked on: head_dim != hidden/heads in all, GQA
# ratio 4 in the first and third, windows of 8-16 with prompts 3-5x the
# window so the rings wrap.
SYNTH_SHAPES = {
    "gqa4_w8": dict(hidden=64, ff=128, layers=4, heads=4, kv_heads=1, head_dim=32, vocab=256, window=8,
                    pattern="SSSF", prompt=40, seed=1),
    "mha_w16": dict(hidden=48, ff=96, layers=3, heads=2, kv_heads=2, head_dim=40, vocab=300, window=16,
                    pattern="SFS", prompt=50, seed=2),
    "gqa4_8layers_w12": dict(hidden=96, ff=160, layers=8, heads=8, kv_heads=2, head_dim=16, vocab=320, window=12,
                             pattern="SSSF", prompt=45, seed=3),
}


def run_spark(args, expect_rc=0, input=None, timeout=600):
    """Run `spark ARGS`; assert the exit status and that no sanitizer spoke.

    expect_rc: an int, or None to accept any status that is not a crash.
    Returns the CompletedProcess (text mode)."""
    proc = subprocess.run([SPARK_BIN] + [str(a) for a in args], capture_output=True,
                          text=True, input=input, timeout=timeout,
                          errors="replace")
    out = proc.stdout + proc.stderr
    for mark in SANITIZER_MARKS:
        assert mark not in out, f"sanitizer report from spark {args}:\n{out[-4000:]}"
    assert proc.returncode >= 0, f"spark {args} died by signal {-proc.returncode}:\n{out[-2000:]}"
    assert proc.returncode != 86, f"sanitizer exit from spark {args}:\n{out[-4000:]}"
    if expect_rc is not None:
        assert proc.returncode == expect_rc, (
            f"spark {args}: exit {proc.returncode}, expected {expect_rc}\n"
            f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}")
    return proc


def require_gpu(tmp_path_factory):
    """pytest.skip unless `spark logits --gpu` runs here; a failure for any
    reason other than a missing device fails the test instead."""
    import mkmodel  # tools/, on PYTHONPATH for the tests
    import pytest

    d = tmp_path_factory.mktemp("probe")
    mkmodel.make_model(str(d / "m"), hidden=32, ff=64, layers=1, heads=2, kv_heads=1, head_dim=16, vocab=64)
    proc = run_spark(["logits", d / "m", "--ids", "1,2", "--out", d / "x.npy", "--gpu"], expect_rc=None)
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["spark logits --gpu failed"])[-1]
        if "no CUDA device" not in reason and "without CUDA" not in reason:
            pytest.fail(f"spark logits --gpu failed for a reason other than a missing device: {reason}")
        pytest.skip(reason)
    return True


def round_x16(x):
    """x rounded to int16 per 32 values in float32, as the single-token
    quantized products do (the CPU's x8_quant_x16, the GPU's load_x16):
    d = max|x| / 32767, q = rint(x * (32767 / max|x|)); returns d * q."""
    import numpy as np
    g = np.asarray(x, np.float32).reshape(-1, 32)
    amax = np.abs(g).max(axis=1, keepdims=True)
    inv = np.where(amax > 0, np.float32(32767) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(g * inv)  # float32 product, round half to even
    return (q.astype(np.float64) * (amax / np.float32(32767)).astype(np.float64)).reshape(-1)


def head_only_case(tmp, fmt, late_scale=False):
    """A model whose layer matrices are all zero, quantized to fmt: h stays the
    token's embedding row, so decode logits are ONE product, the tied head's,
    of x = rmsnorm(row) * w_final with the quantized embedding. Returns (gguf
    path, ids, float64 products with exact x, with x rounded by round_x16, and
    the relative L2 between those two).

    late_scale: the rounded x is row * w_final, the norm's 1 / RMS applied to
    the product afterwards, as the GPU's load_x16 does (it rounds before the
    RMS is known); the same values in exact arithmetic, but a group's max and
    so its d differ in the last bit, which moves ~1 % of the int16 codes by
    one (bench/cuda_runs.md run 30). Default: x normalised, then rounded, as
    the CPU does."""
    import numpy as np
    import mkmodel
    import ref
    shape = dict(hidden=512, ff=1024, layers=1, heads=2, kv_heads=1, head_dim=256, vocab=1024, window=16,
                 pattern="F", seed=9)
    cfg = mkmodel.build_config(**shape)
    w = mkmodel.make_weights(cfg, 9, "f32")
    for name in w:
        if name.startswith("model.layers.") and not name.endswith("layernorm.weight"):
            w[name] = np.zeros_like(w[name])
    hf, path = Path(tmp) / "head-only", Path(tmp) / f"head-only-{fmt}.gguf"
    mkmodel.write_hf(hf, cfg, w, "f32")
    run_spark(["quantize", hf, path, "--type", fmt, "-q"])
    m = ref.load_model(str(path))
    ids = [5, 77, 300, 901, 1023, 42]
    E, fw = np.asarray(m.embedding, np.float64), np.asarray(m.final_norm, np.float32)
    exact, x16 = [], []
    for t in ids:
        row = E[t].astype(np.float32)
        inv = np.float32(1.0 / np.sqrt(np.mean(row.astype(np.float64) ** 2) + m.eps))
        xn = (row * inv * fw).astype(np.float32)
        exact.append(E @ xn.astype(np.float64))
        x16.append(E @ round_x16((row * fw).astype(np.float32)) * np.float64(inv) if late_scale else E @ round_x16(xn))
    exact, x16 = np.array(exact), np.array(x16)
    gap = float(np.max(np.linalg.norm(exact - x16, axis=1) / np.linalg.norm(exact, axis=1)))
    assert gap > 1e-7, f"rounding x to int16 moved nothing ({gap:.3g}): the case cannot tell the paths apart"
    return path, ids, exact, x16, gap

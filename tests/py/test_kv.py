"""KV-cache formats end to end (issue 7): f16/bf16 and TurboQuant caches
through `spark logits`, against tools/ref.py's independent simulation of the
same formats; prefill = decode; quality on the trained spark-tiny; the
memory plan (`--ctx` too large for this machine is refused up front with the
numbers; a default context is lowered instead); flags and inspect's table.

Budgets (measured, then given ~3-10x headroom):
- C vs ref.py simulation, relative L2 per position: 2e-5 (measured 1.1e-6
  for bf16 and every TurboQuant width: the same as the exact f32 path). The
  C cache rounds float32 keys, the reference float64 ones, so a value that
  sits within ~1e-7 of a rounding boundary can round the other way. For
  TurboQuant's coarse codebook cells and bf16's 8-bit mantissa that almost
  never happens; f16's 11 bits flip a few of the ~10k values each run, and
  the synthetic model carries each flip (a whole f16 ulp) to the logits
  (measured: perturbing the reference's keys by 1e-7 moves its f16 logits
  by 2.3e-4). So f16 is held only to half its own effect here; its exactness
  is tested on the kernel (tests/c/test_kv_turbo.c) and by prefill = decode.
- spark-tiny, 512 held-out tokens, mean KL of next-token distributions from
  the f32 cache: see KL_BUDGET.
"""
import json
import re

import numpy as np
import pytest

import mkmodel
import ref
from conftest_models import TINY, tokenizer_dir
from sparktest import run_spark

KV_FLAGS = {
    "f16": ["--kv-type", "f16"],
    "bf16": ["--kv-type", "bf16"],
    "tq2": ["--kv-bits", "2"],
    "tq3": ["--kv-bits", "3"],
    "tq3.5": ["--kv-bits", "3.5"],
    "tq4": ["--kv-bits", "4"],
}
SIM_TOL = {"bf16": 2e-5, "tq2": 2e-5, "tq3": 2e-5, "tq3.5": 2e-5, "tq4": 2e-5}

# head_dim a power of two (TurboQuant needs it); GQA 4; rings that wrap
SHAPE = dict(hidden=64, ff=128, layers=4, heads=4, kv_heads=1, head_dim=32, vocab=256, window=8,
             pattern="SSSF", seed=11)
N_IDS = 40


def rel_l2_rows(a, b):
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv")
    path = root / "m"
    mkmodel.make_model(str(path), max_ctx=256, **SHAPE)
    ids = [int(i) for i in np.random.default_rng(5).integers(0, SHAPE["vocab"], N_IDS)]
    return path, ids, ref.load_model(str(path))


def spark_logits(tmp, model, ids, *flags):
    out = tmp / "logits.npy"
    run_spark(["logits", model, "--ids", ",".join(map(str, ids)), "--out", out, "--all", *flags])
    return np.load(out).astype(np.float64)


@pytest.mark.parametrize("layers", ["full", "all"])
@pytest.mark.parametrize("kv", list(KV_FLAGS))
def test_matches_reference_simulation(synth, tmp_path, kv, layers):
    model, ids, m = synth
    quantized = kv.startswith("tq")
    if layers == "all" and not quantized:
        pytest.skip("--kv-type applies to every layer already")
    flags = KV_FLAGS[kv] + (["--kv-layers", layers] if quantized else [])
    sim = (kv, kv if (layers == "all" or not quantized) else "f32")
    want = ref.forward(m, ids, kv=sim)
    got = spark_logits(tmp_path, model, ids, *flags, "--batch", "16")
    err = rel_l2_rows(got, want).max()
    exact = rel_l2_rows(ref.forward(m, ids), want).max()
    print(f"{kv} {layers}: C vs simulation {err:.2e}; the format moves the logits by {exact:.2e}")
    if kv == "f16":  # rounding flips, see the module docstring
        assert err <= 0.5 * exact, f"f16: relative L2 {err:.3e} vs ref.py's simulation, effect {exact:.3e}"
        return
    assert err <= SIM_TOL[kv], f"{kv} {layers}: relative L2 {err:.3e} vs ref.py's simulation"
    assert exact > 100 * err, "the format's own effect must dwarf the C/reference difference (else the test is blind)"


@pytest.mark.parametrize("kv", ["bf16", "tq3.5", "tq2"])
def test_prefill_equals_decode(synth, tmp_path, kv):
    model, ids, _ = synth
    flags = KV_FLAGS[kv] + ["--kv-layers", "all"] if kv.startswith("tq") else KV_FLAGS[kv]
    pre = spark_logits(tmp_path, model, ids, *flags)
    chunked = spark_logits(tmp_path, model, ids, *flags, "--batch", "7")
    dec = spark_logits(tmp_path, model, ids, *flags, "--mode", "decode")
    assert rel_l2_rows(chunked, pre).max() < 1e-5
    assert rel_l2_rows(dec, pre).max() < 1e-5


# ---- spark-tiny (trained): how much each format moves the next-token distribution ----

# mean KL (nats) from the f32 cache over 511 positions; measured values in the comments
KL_BUDGET = {
    ("f16", "all"): 1e-7,     # measured 1.8e-8
    ("bf16", "all"): 5e-6,    # 1.1e-6
    ("tq4", "full"): 3e-4,    # 6.8e-5
    ("tq4", "all"): 1e-2,     # 3.0e-3
    ("tq3.5", "all"): 2e-2,   # 6.2e-3
    ("tq3", "all"): 3e-2,     # 9.9e-3
    ("tq2", "all"): 1.2e-1,   # 4.1e-2
}


@pytest.fixture(scope="module")
def tiny_ids():
    text = (TINY / "heldout.txt").read_text()[:4000]
    ids = json.loads(run_spark(["tokenize", TINY, "--text", text, "--json"]).stdout)
    assert len(ids) >= 512
    return ids[:512]


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def test_spark_tiny_kl_per_format(tiny_ids, tmp_path):
    base = log_softmax(spark_logits(tmp_path, TINY, tiny_ids))
    kls = {}
    for (kv, layers), budget in KL_BUDGET.items():
        flags = KV_FLAGS[kv] + (["--kv-layers", layers] if kv.startswith("tq") else [])
        lp = log_softmax(spark_logits(tmp_path, TINY, tiny_ids, *flags))
        kls[kv, layers] = float((np.exp(base) * (base - lp)).sum(axis=1).mean())
        print(f"spark-tiny {kv:6s} {layers:4s}: mean KL {kls[kv, layers]:.2e} (budget {budget:.0e})")
        assert kls[kv, layers] <= budget, f"{kv} {layers}: mean KL {kls[kv, layers]:.3e} > {budget}"
    # more bits, less damage; quantizing the rings too costs more than the full layers alone
    assert kls["tq4", "all"] < kls["tq3.5", "all"] < kls["tq3", "all"] < kls["tq2", "all"]
    assert kls["tq4", "full"] < kls["tq4", "all"]
    assert kls["f16", "all"] < kls["bf16", "all"] < kls["tq4", "full"]


# ---- memory plan ---------------------------------------------------------------------

HUGE_CTX = 1 << 30  # 2 full layers x 2 x 4 kv heads x 64 dims x 4 bytes = 4 KB a position: 4.4 TB


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    """A small model that claims a context of 2^30 positions, with a tokenizer (for `spark run`)."""
    path = tmp_path_factory.mktemp("huge") / "m"
    mkmodel.make_model(str(path), tokenizer=str(tokenizer_dir()), hidden=64, ff=128, layers=8, heads=4, kv_heads=4,
                       head_dim=64, window=16, max_ctx=HUGE_CTX, seed=3)
    return path


def test_huge_context_is_refused_with_numbers(huge, tmp_path):
    out = tmp_path / "x.npy"
    for args in (["logits", huge, "--ids", "1,2", "--out", out, "--ctx", HUGE_CTX],
                 ["run", "-m", huge, "-p", "hello", "--ctx", HUGE_CTX, "-n", "2"],
                 ["perplexity", huge, "--file", TINY / "heldout.txt", "--ctx", HUGE_CTX]):
        err = run_spark(args, expect_rc=1).stderr
        assert f"a context of {HUGE_CTX} positions needs" in err, err
        # the KV bytes: 2 full layers x 2 x 4 x 64 x 4 = 4096 bytes a position, 4398.05 GB
        assert "4096 bytes per position" in err and "KV cache 4398.05 GB" in err, err
        assert re.search(r"only [\d.]+ GB is available", err), err
        assert "--kv-bits 4 (KV cache " in err and re.search(r"--ctx \d+ or less", err), err
        assert not out.exists()


def test_huge_context_refused_even_quantized(huge, tmp_path):
    err = run_spark(["logits", huge, "--ids", "1,2", "--out", tmp_path / "x.npy", "--ctx", HUGE_CTX,
                     "--kv-bits", "4"], expect_rc=1).stderr
    # tq4 at head_dim 64: 4 + 32 bytes a row: 2 x 2 x 4 x 36 = 576 bytes a position
    assert "576 bytes per position" in err and "tq4 full layers" in err, err
    assert "--kv-bits 2 (KV cache " in err, err


def test_default_context_is_lowered_to_fit(huge, tmp_path):
    """No --ctx: the model's maximum (1G positions) does not fit, the largest
    context that does is used, with a note; the run succeeds."""
    out = tmp_path / "x.npy"
    proc = run_spark(["logits", huge, "--ids", "1,2,3", "--out", out])
    m = re.search(r"note: context lowered to (\d+) positions", proc.stderr)
    assert m, proc.stderr
    assert 3 <= int(m.group(1)) < HUGE_CTX and int(m.group(1)) % 256 == 0
    assert np.load(out).shape[0] == 1


def test_context_that_fits_runs(huge, tmp_path):
    run_spark(["logits", huge, "--ids", "1,2", "--out", tmp_path / "x.npy", "--ctx", 4096, "--kv-bits", "3.5"])


# ---- flags and inspect ------------------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    (["--kv-bits", "5"], "--kv-bits expects off, 2, 3, 3.5 or 4; got '5'"),
    (["--kv-type", "q8"], "--kv-type expects f32, f16 or bf16; got 'q8'"),
    (["--kv-layers", "some"], "--kv-layers expects full or all; got 'some'"),
])
def test_bad_flags(synth, tmp_path, args, needle):
    model, _, _ = synth
    err = run_spark(["logits", model, "--ids", "1", "--out", tmp_path / "x.npy", *args], expect_rc=2).stderr
    assert needle in err


def test_turboquant_needs_power_of_two_head_dim(tmp_path):
    path = tmp_path / "hd40"
    mkmodel.make_model(str(path), hidden=48, ff=96, layers=2, heads=2, kv_heads=2, head_dim=40, vocab=64,
                       window=4, pattern="SF", seed=1)
    err = run_spark(["logits", path, "--ids", "1,2", "--out", tmp_path / "x.npy", "--kv-bits", "4"],
                    expect_rc=1).stderr
    assert "power of two" in err and "head_dim 40" in err, err
    run_spark(["logits", path, "--ids", "1,2", "--out", tmp_path / "x.npy", "--kv-type", "f16"])


def test_inspect_table(synth):
    model, _, _ = synth
    info = json.loads(run_spark(["inspect", model, "--json", "--ctx", "100"]).stdout)
    fmts = {(f["type"], f["layers"]): f for f in info["kv_formats"]}
    D, Hk, window = SHAPE["head_dim"], SHAPE["kv_heads"], SHAPE["window"]
    # one full layer (SSSF), three sliding rings of `window` rows
    assert fmts["f32", "all"]["bytes_per_token"] == 2 * Hk * D * 4
    assert fmts["f16", "all"]["bytes_per_token"] == 2 * Hk * D * 2
    assert fmts["tq4", "full"]["bytes_per_token"] == 2 * Hk * (4 + D // 2)
    assert fmts["tq3.5", "full"]["bytes_per_token"] == Hk * (4 + 3 * D // 8) + Hk * (4 + D // 2)
    assert fmts["tq2", "full"]["sliding_bytes"] == 3 * window * 2 * Hk * D * 4  # rings stay f32
    assert fmts["tq2", "all"]["sliding_bytes"] == 3 * window * 2 * Hk * (4 + D // 4)
    assert fmts["tq4", "all"]["bytes_at_context"] == 100 * 2 * Hk * (4 + D // 2) + 3 * window * 2 * Hk * (4 + D // 2)
    assert info["kv_dtype"] == "f32" and info["kv_context"] == 100
    chosen = json.loads(run_spark(["inspect", model, "--json", "--kv-bits", "3.5"]).stdout)
    assert chosen["kv_dtype"] == "tq3.5" and chosen["kv_dtype_sliding"] == "f32"
    text = run_spark(["inspect", model, "--kv-bits", "2", "--kv-layers", "all"]).stdout
    assert "full layers tq2, sliding rings tq2" in text and "tq3.5" in text


def test_prompt_progress_shows_rate_and_eta(tmp_path):
    """A long prompt on a terminal: the bar reports tokens/s and the time left."""
    import pexpect
    from conftest_models import make_chat_model
    from sparktest import SPARK_BIN
    model = make_chat_model(tmp_path)
    text = (TINY / "heldout.txt").read_text()[:6000]
    child = pexpect.spawn(SPARK_BIN, ["run", "-m", str(model), "-p", text, "-b", "16", "-n", "1", "--temp", "0"],
                          encoding="utf-8", timeout=300)
    child.expect(r"prompt \[[#.]+\] \d+/(\d+)  \d+ tok/s, ETA \d+:\d\d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

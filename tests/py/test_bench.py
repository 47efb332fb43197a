"""`spark bench`: the --json schema and the table, on a tiny model with tiny
runs (the numbers themselves are not asserted: the machine is shared)."""
import json

import pytest

import mkmodel
from sparktest import run_spark

KEYS = {"pp_tok_s", "tg_tok_s", "threads", "weights_bytes", "bandwidth_gb_s", "floor_pct", "pp_gflop_s",
        "fma_peak_gflop_s", "pp_peak_pct", "tg_gb_s", "floor_tok_s", "tg_bytes_per_token", "model", "cpu", "isa",
        "params", "pp_tokens", "tg_tokens", "reps"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    mkmodel.make_model(str(root / "hf"), hidden=64, ff=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=256,
                       window=8, dtype="bf16", gguf=str(root / "tiny.gguf"))
    return root / "tiny.gguf"


def test_json_schema(model):
    proc = run_spark(["bench", model, "-p", "16", "-n", "4", "-t", "2", "-r", "2", "--probe-mb", "8", "--json"])
    out = json.loads(proc.stdout)
    assert KEYS <= set(out), KEYS - set(out)
    assert out["threads"] == 2 and out["pp_tokens"] == 16 and out["tg_tokens"] == 4 and out["reps"] == 2
    assert out["model"] == "tiny.gguf" and out["isa"] in ("scalar", "avx2", "avx512", "neon")
    for k in ("pp_tok_s", "tg_tok_s", "bandwidth_gb_s", "fma_peak_gflop_s", "pp_gflop_s", "tg_gb_s", "floor_pct",
              "pp_peak_pct", "floor_tok_s"):
        assert isinstance(out[k], (int, float)) and out[k] > 0, k
    # weights of the model: bf16 matrices + f32 norms, as the loader counts them
    assert out["weights_bytes"] > 2 * 256 * 64
    assert out["tg_bytes_per_token"] >= out["weights_bytes"]
    assert out["tg_gb_s"] == pytest.approx(out["tg_bytes_per_token"] * out["tg_tok_s"] / 1e9, rel=1e-3)
    assert out["floor_pct"] == pytest.approx(100 * out["tg_gb_s"] / out["bandwidth_gb_s"], rel=1e-3)


def test_paired_decode(model):
    """The paired test: each token against the faster neighbouring pass of the
    probe's loop over the weights; the quantiles are ordered and finite, the
    test's own ceiling (a probe pass scored as a token) comes with them, and
    --no-pair / --no-probe leave the fields out."""
    out = json.loads(run_spark(["bench", model, "-p", "0", "-n", "5", "-t", "2", "--probe-mb", "8",
                                "--json"]).stdout)
    assert out["paired_tokens"] == 5 and out["paired_tok_s"] > 0
    q = [out[f"paired_pct_{k}"] for k in ("min", "p25", "median", "p75", "max")]
    assert all(v > 0 for v in q) and q == sorted(q), q
    g = [out[f"paired_probe_gb_s_{k}"] for k in ("min", "median", "max")]
    assert all(v > 0 for v in g) and g == sorted(g), g
    # the test's own ceiling: readings 1..4 (of 0..5) scored as tokens are
    assert out["paired_self_passes"] == 4
    c = [out[f"paired_self_pct_{k}"] for k in ("p25", "median", "p75")]
    assert all(v > 0 for v in c) and c == sorted(c), c
    for flag in ("--no-pair", "--no-probe"):
        out = json.loads(run_spark(["bench", model, "-p", "0", "-n", "2", "--probe-mb", "8", flag,
                                    "--json"]).stdout)
        assert "paired_pct_median" not in out and "paired_self_pct_median" not in out and out["tg_tok_s"] > 0
    text = run_spark(["bench", model, "-p", "0", "-n", "2", "--probe-mb", "8"]).stdout
    assert "paired with the probe's loop over the weights" in text
    assert "the paired test's own ceiling" in text
    out = json.loads(run_spark(["bench", model, "-p", "0", "-n", "1", "--probe-mb", "8", "--json"]).stdout)
    assert out["paired_tokens"] == 1 and "paired_self_passes" not in out  # needs a reading on each side


def test_kv_cache_formats_count_their_bytes(model):
    """--kv-type / --kv-bits reach the session, and the decode's bytes a token
    count the cache rows in that format: f16 reads half of f32's KV bytes,
    TurboQuant 4-bit on the full layers (none in this 2-layer SSSF model)
    the same as f32. Expected bytes from the model's shape, here."""
    def bench(*flags):
        return json.loads(run_spark(["bench", model, "-p", "0", "-n", "12", "--no-probe", "--json", *flags]).stdout)
    f32, f16, tq4 = bench(), bench("--kv-type", "f16"), bench("--kv-bits", "4")
    assert (f32["kv_type"], f16["kv_type"], tq4["kv_type"]) == ("f32", "f16", "tq4")
    assert (f32["kv_type_sliding"], f16["kv_type_sliding"], tq4["kv_type_sliding"]) == ("f32", "f16", "f32")
    # 2 sliding layers (window 8) x 2 kv heads x 16 dims, k and v; token p sees min(p + 1, 8) keys
    values = sum(2 * min(p + 1, 8) * 2 * 16 * 2 for p in range(12)) / 12
    assert f32["tg_bytes_per_token"] - f32["weights_bytes"] == pytest.approx(4 * values)
    assert f16["tg_bytes_per_token"] - f16["weights_bytes"] == pytest.approx(2 * values)
    assert tq4["tg_bytes_per_token"] == pytest.approx(f32["tg_bytes_per_token"])
    run_spark(["bench", model, "--kv-type", "f8"], expect_rc=2)


def test_decode_at_depth(model):
    """-d N: the decode test's tokens sit at positions N.. (its N prompt
    tokens untimed), so each reads the cache rows of N earlier positions: the
    bytes a token count them. The model's sliding window is 8, so at depth
    20 every token sees 8 keys (at depth 0 token p sees p + 1)."""
    out = json.loads(run_spark(["bench", model, "-p", "0", "-n", "4", "-d", "20", "--no-probe", "--json"]).stdout)
    assert out["tg_depth"] == 20 and out["tg_tok_s"] > 0
    assert out["tg_bytes_per_token"] - out["weights_bytes"] == pytest.approx(2 * 8 * 2 * 16 * 2 * 4)
    text = run_spark(["bench", model, "-p", "0", "-n", "2", "-d", "9", "--no-probe"]).stdout
    assert "tg2@d9" in text
    proc = run_spark(["bench", model, "-n", "8", "-d", "1000000", "--no-probe"], expect_rc=2)
    assert "1000008 positions" in proc.stderr, proc.stderr
    run_spark(["bench", model, "-d", "x"], expect_rc=2)


def test_skipping_tests_and_probes(model):
    out = json.loads(run_spark(["bench", model, "-p", "0", "-n", "3", "--no-probe", "--json"]).stdout)
    assert out["pp_tok_s"] == 0 and out["tg_tok_s"] > 0
    assert out["bandwidth_gb_s"] == 0 and out["floor_pct"] == 0


def test_table(model):
    text = run_spark(["bench", model, "-p", "8", "-n", "2", "--probe-mb", "8"]).stdout
    assert "| model" in text and "pp8" in text and "tg2" in text
    assert "GB/s" in text and "% of the floor" in text and "GFLOP/s" in text


def test_usage_errors(model):
    run_spark(["bench"], expect_rc=2)
    run_spark(["bench", model, "-p", "x"], expect_rc=2)
    run_spark(["bench", model, "--frobnicate"], expect_rc=2)
    run_spark(["bench", model.parent / "missing.gguf", "--no-probe"], expect_rc=1)


def test_gpu_bench(model):
    """--gpu: the probes are the GPU's (copy bandwidth, bf16 GEMM peak) and the
    ratios are taken against them; without a device a clear error, exit 1."""
    proc = run_spark(["bench", model, "--gpu", "-p", "16", "-n", "8", "--json"], expect_rc=None)
    if proc.returncode != 0:
        assert proc.returncode == 1 and "no CUDA device" in proc.stderr, proc.stderr
        pytest.skip("no CUDA device: " + proc.stderr.strip().splitlines()[-1])
    out = json.loads(proc.stdout)
    assert out["backend"] == "cuda"
    assert out["bandwidth_gb_s"] > 100 and out["fma_peak_gflop_s"] > 1000  # any CUDA GPU of compute 8.0+
    assert out["floor_pct"] == pytest.approx(100 * out["tg_gb_s"] / out["bandwidth_gb_s"], rel=1e-3)
    assert out["pp_peak_pct"] == pytest.approx(100 * out["pp_gflop_s"] / out["fma_peak_gflop_s"], rel=1e-3)

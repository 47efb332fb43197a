"""How the weights are held (--mmap / --no-mmap, SPARK_LOAD_AUTO): the logits
are bit-identical either way, a truncated file fails the same way in both
modes naming the file, and the fallback when transparent huge pages are off
is taken and reported."""
import json

import numpy as np
import pytest

import mkmodel
from sparktest import run_spark

SHAPE = dict(hidden=32, ff=64, layers=2, heads=2, kv_heads=1, head_dim=16, vocab=64, window=4, pattern="SF", seed=11)
IDS = "1,5,9,3,7,2,8,4,6"
MODES = ["--mmap", "--no-mmap"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    mkmodel.make_model(str(root / "hf"), gguf=str(root / "m.gguf"), **SHAPE)
    return root


def logits(model, tmp_path, *flags):
    out = tmp_path / ("l%d.npy" % len(list(tmp_path.iterdir())))
    run_spark(["logits", model, "--ids", IDS, "--all", "--out", out, *flags])
    return np.load(out)


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_logits_identical_mmap_and_copy(models, tmp_path, fmt, mode):
    model = models / ("m.gguf" if fmt == "gguf" else "hf")
    a = logits(model, tmp_path, "--mmap", "--mode", mode)
    b = logits(model, tmp_path, "--no-mmap", "--mode", mode)
    c = logits(model, tmp_path, "--mode", mode)  # AUTO
    assert a.dtype == np.float32 and a.shape == (9, 64)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert np.array_equal(a.view(np.uint32), c.view(np.uint32))


@pytest.mark.parametrize("flag", MODES)
def test_truncated_gguf_fails_in_both_modes(models, tmp_path, flag):
    data = (models / "m.gguf").read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) - 100])
    p = run_spark(["logits", bad, "--ids", "1,2", "--out", tmp_path / "x.npy", flag], expect_rc=1)
    assert str(bad) in p.stderr and "past end of file" in p.stderr, p.stderr
    assert not (tmp_path / "x.npy").exists()


@pytest.mark.parametrize("flag", MODES)
def test_truncated_safetensors_fails_in_both_modes(models, tmp_path, flag):
    import shutil
    d = tmp_path / "hf"
    shutil.copytree(models / "hf", d)
    st = d / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) - 64])
    p = run_spark(["logits", d, "--ids", "1,2", "--out", tmp_path / "x.npy", flag], expect_rc=1)
    assert "model.safetensors" in p.stderr, p.stderr


def bench_json(model, *flags, env=None):
    import os
    import subprocess
    from sparktest import SPARK_BIN
    e = dict(os.environ, **(env or {}))
    p = subprocess.run([SPARK_BIN, "bench", str(model), "-p", "4", "-n", "2", "--no-probe", "--json", *flags],
                       capture_output=True, text=True, env=e, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


def test_bench_reports_the_load_mode(models):
    r, err = bench_json(models / "m.gguf", "--mmap")
    assert r["load_mode"] == "mmap" and not r["huge_pages"] and "asked for" in r["load_note"]
    r, err = bench_json(models / "m.gguf", "--no-mmap")
    assert r["load_mode"] == "copy"
    assert r["huge_pages"] == (r["thp"] != "never")
    r, err = bench_json(models / "m.gguf")  # a small model fits: AUTO copies
    assert r["load_mode"] == "copy" and "read into memory" in r["load_note"]
    assert "spark bench: weights read into memory" in err


def test_thp_never_fallback(models, tmp_path):
    never = tmp_path / "thp"
    never.write_text("always madvise [never]\n")
    r, err = bench_json(models / "m.gguf", env={"SPARK_THP_ENABLED_FILE": str(never)})
    assert r["thp"] == "never" and r["load_mode"] == "copy" and not r["huge_pages"]
    assert "without huge pages" in r["load_note"] and "'never'" in r["load_note"]
    # the table says it too
    import os
    import subprocess
    from sparktest import SPARK_BIN
    p = subprocess.run([SPARK_BIN, "bench", str(models / "m.gguf"), "-p", "0", "-n", "2", "--no-probe"],
                       capture_output=True, text=True, env=dict(os.environ, SPARK_THP_ENABLED_FILE=str(never)))
    assert p.returncode == 0 and "weights: read into memory without huge pages" in p.stdout, p.stdout


def test_flags_on_run_and_help():
    for cmd in ["run", "logits", "perplexity", "bench", "serve"]:
        out = run_spark([cmd, "--help"]).stdout
        assert "--no-mmap" in out and "--mmap" in out, cmd

"""The quality gate on spark-tiny, the small trained spark2_5 model: spark.c's
held-out perplexity equals the PyTorch model's (stored at export in
models/spark-tiny/reference.json) within 0.5 %, and the greedy continuation
of the three stored prompts equals PyTorch's for 64 tokens, for both the HF
directory and the bf16 GGUF file. (Measured: 58.5298390 vs 58.5298382.)

Under the sanitizer build the perplexity uses the stored 8-window subset, to
keep the suite's time in bounds; the full held-out text runs in the normal
build."""
import json
import os

import pytest

from sparktest import ROOT, run_spark

MODEL = ROOT / "models" / "spark-tiny"
REF = json.loads((MODEL / "reference.json").read_text())
FILES = {"hf": MODEL, "gguf": MODEL / "spark-tiny-bf16.gguf"}
SANITIZED = "asan" in os.environ.get("SPARK_BUILD", "")


@pytest.mark.parametrize("fmt", FILES)
def test_heldout_perplexity_equals_pytorch(fmt):
    held = REF["heldout"]
    args = ["perplexity", FILES[fmt], "--file", MODEL / held["file"], "--ctx", held["ctx"], "--stride",
            held["stride"], "--json"]
    want = held["ppl"]
    if SANITIZED:
        args += ["--chunks", held["subset"]["windows"]]
        want = held["subset"]["ppl"]
    got = json.loads(run_spark(args, timeout=1200).stdout)
    assert got["scored"] == (held["subset"]["scored"] if SANITIZED else held["scored"])
    rel = abs(got["ppl"] - want) / want
    print(f"{fmt}: spark.c ppl {got['ppl']:.7f}, PyTorch {want:.7f}, relative difference {rel:.2e}")
    assert rel <= 0.005


@pytest.mark.parametrize("fmt", FILES)
@pytest.mark.parametrize("case", range(len(REF["greedy"])))
def test_greedy_continuation_equals_pytorch(fmt, case):
    c = REF["greedy"][case]
    ids = c["greedy_ids"]
    assert len(ids) == 64
    tok = run_spark(["tokenize", FILES[fmt], "--text", c["prompt"], "--json"]).stdout
    assert json.loads(tok) == c["prompt_ids"]
    want = run_spark(["detokenize", FILES[fmt], "--ids", ",".join(map(str, ids))]).stdout.rstrip("\n")
    got = run_spark(["run", "-m", FILES[fmt], "-p", c["prompt"], "-n", "64", "--temp", "0"]).stdout.rstrip("\n")
    assert got == want


def test_make_run_text_is_the_default_model():
    """`spark run` without -m uses the embedded spark-tiny (what `make run` runs)."""
    c = REF["greedy"][1]
    got = run_spark(["run", "-p", c["prompt"], "-n", "16", "--temp", "0"]).stdout
    want = run_spark(["run", "-m", MODEL, "-p", c["prompt"], "-n", "16", "--temp", "0"]).stdout
    assert got == want and len(got.strip()) > 10


def test_q8_0_file_stays_within_budget():
    """The shipped Q8_0 GGUF (made by `spark quantize models/spark-tiny OUT --type q8_0`):
    measured 57.2504 vs 57.2527 for bf16 on the 8-window subset (-0.004 %);
    the budget is 1 %."""
    held = REF["heldout"]
    got = json.loads(run_spark(["perplexity", MODEL / "spark-tiny-q8_0.gguf", "--file", MODEL / held["file"],
                                "--chunks", held["subset"]["windows"], "--json"]).stdout)
    assert abs(got["ppl"] - held["subset"]["ppl"]) / held["subset"]["ppl"] <= 0.01

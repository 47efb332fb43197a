"""`spark run` and examples/minimal.c as a user drives them: same tokens from
the C API example and the CLI, seeded sampling reproducible, stop strings
cut exactly, bad input refused with a clear message."""
import os
import subprocess
from pathlib import Path

import pytest

from conftest_models import make_chat_model
from sparktest import ROOT, SPARK_BIN, run_spark

MINIMAL = Path(SPARK_BIN).parent / "examples" / "minimal"
PROMPT = "In the beginning God created"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_chat_model(tmp_path_factory.mktemp("gen"))


def run_text(model, *args):
    return run_spark(["run", "-m", model, *args]).stdout


def test_minimal_example_equals_spark_run(model):
    proc = subprocess.run([str(MINIMAL), str(model), PROMPT, "24"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "24 generated" in proc.stderr
    cli = run_text(model, "-p", PROMPT, "-n", "24", "--temp", "0")
    assert proc.stdout == cli.rstrip("\n") or proc.stdout == cli
    assert len(proc.stdout) > 0


def test_greedy_is_deterministic_and_seed_reproducible(model):
    a = run_text(model, "-p", PROMPT, "-n", "20", "--temp", "1", "--seed", "5")
    b = run_text(model, "-p", PROMPT, "-n", "20", "--temp", "1", "--seed", "5")
    c = run_text(model, "-p", PROMPT, "-n", "20", "--temp", "1", "--seed", "6")
    assert a == b
    assert a != c


def test_speeds_on_stderr(model):
    proc = run_spark(["run", "-m", model, "-p", PROMPT, "-n", "5", "--temp", "0"])
    assert "prompt:" in proc.stderr and "tok/s" in proc.stderr
    assert "tok/s" not in proc.stdout


def test_stop_string_cuts_exactly(model):
    full = run_text(model, "-p", PROMPT, "-n", "30", "--temp", "0").rstrip("\n")
    assert len(full) > 12
    stop = full[8:12]  # a stop string that may straddle tokens
    cut = run_text(model, "-p", PROMPT, "-n", "30", "--temp", "0", "--stop", stop).rstrip("\n")
    assert cut == full[: full.index(stop)]


def test_prompt_from_file_and_stdin(model, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text(PROMPT)
    a = run_text(model, "-f", f, "-n", "8", "--temp", "0")
    b = run_spark(["run", "-m", model, "-n", "8", "--temp", "0"], input=PROMPT).stdout
    c = run_text(model, "-p", PROMPT, "-n", "8", "--temp", "0")
    assert a == b == c


def test_chat_mode_runs(model):
    proc = run_spark(["run", "-m", model, "-p", "Hello", "--chat", "--no-think", "-n", "8", "--temp", "0",
                      "--system", "Be brief."])
    assert "generated: " in proc.stderr


def test_default_model_is_the_embedded_one():
    if not (ROOT / "models" / "spark-tiny" / "config.json").exists():
        pytest.skip("models/spark-tiny is not in this checkout")
    proc = run_spark(["run", "-p", "And God said", "-n", "8", "--temp", "0"])
    assert proc.stdout.strip()


@pytest.mark.parametrize("args,needle", [
    (["-p", ""], "empty"),
    (["-p", "x " * 3000, "--ctx", "64"], "context"),
])
def test_bad_prompts(model, args, needle):
    proc = run_spark(["run", "-m", model, *args], expect_rc=1)
    assert needle in proc.stderr


def test_invalid_utf8_prompt_file(model, tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"In the \xff\xfe beginning")
    proc = run_spark(["run", "-m", model, "-f", f], expect_rc=1)
    assert "invalid UTF-8" in proc.stderr and "byte 7" in proc.stderr


@pytest.mark.parametrize("flag,value", [
    ("--temp", "-1"), ("--temp", "nan"), ("--top-p", "0"), ("--top-p", "1.5"), ("--min-p", "-0.1"),
    ("--top-k", "-3"), ("--repeat-penalty", "0"), ("-n", "abc"), ("--ctx", "0"), ("--seed", "-4"),
])
def test_bad_sampling_values(model, flag, value):
    proc = run_spark(["run", "-m", model, "-p", "x", flag, value], expect_rc=2)
    assert flag in proc.stderr


def test_missing_model_is_a_clear_error(tmp_path):
    proc = run_spark(["run", "-m", tmp_path / "nothing", "-p", "x"], expect_rc=1)
    assert "nothing" in proc.stderr


@pytest.mark.parametrize("cmd", ["run", "chat", "logits", "inspect"])
def test_help_documents_every_flag(cmd):
    out = run_spark([cmd, "--help"]).stdout
    assert "usage: spark " + cmd in out
    if cmd in ("run", "chat"):
        for flag in ("--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed", "--ctx", "-n",
                     "--no-think", "--show-think", "--system", "--stop"):
            assert flag in out, f"{cmd} --help lacks {flag}"


def test_top_level_help():
    out = run_spark(["--help"]).stdout
    for cmd in ("run", "chat", "inspect", "logits"):
        assert cmd in out
    assert run_spark([], expect_rc=2).stderr

"""Helpers shared by the Python tests: run the spark binary, make models."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SPARK_BIN = os.environ.get("SPARK_BIN", str(ROOT / "build" / "spark"))
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


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

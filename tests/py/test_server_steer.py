"""`spark serve --steer`: the instruments through the server's options. A
greedy completion from a steered server equals `spark run` with the same
steering, and differs from an unsteered one."""
import numpy as np
import pytest

from conftest_models import TINY
from sparktest import run_spark
from test_server_support import Server

PROMPT = "And it came to pass"


@pytest.fixture(scope="module")
def direction(tmp_path_factory):
    if not (TINY / "config.json").exists():
        pytest.skip("models/spark-tiny is not in this checkout")
    d = np.zeros((8, 256), np.float32)
    d[3] = np.random.default_rng(5).normal(0, 1, 256)
    path = tmp_path_factory.mktemp("steer") / "d.npy"
    np.save(path, d)
    return path


def complete(server):
    r = server.client().completions.create(model="spark-tiny", prompt=PROMPT, max_tokens=24, temperature=0)
    return r.choices[0].text


def test_steered_server_matches_steered_run(direction):
    steer = ["--steer", direction, "--steer-strength", "3", "--steer-layers", "3-3"]
    srv = Server(TINY, "--parallel", "1", *steer)
    try:
        steered = complete(srv)
    finally:
        srv.stop()
    plain_srv = Server(TINY, "--parallel", "1")
    try:
        plain = complete(plain_srv)
    finally:
        plain_srv.stop()
    run = run_spark(["run", "-m", TINY, "-p", PROMPT, "-n", "24", "--temp", "0", *steer]).stdout
    assert steered != plain
    assert steered == run.rstrip("\n") or steered == run


def test_bad_steer_file_stops_the_server_cleanly(tmp_path):
    if not (TINY / "config.json").exists():
        pytest.skip("models/spark-tiny is not in this checkout")
    with pytest.raises(RuntimeError, match="nope.npy"):
        Server(TINY, "--steer", tmp_path / "nope.npy")

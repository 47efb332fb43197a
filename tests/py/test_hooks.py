"""The instruments against tools/ref.py: steering (each mode) and residual
capture equal the float64 reference; FFN statistics equal a NumPy
computation from the reference's activations and leave logits unchanged;
steer-extract -> --steer works end to end."""
import json

import numpy as np
import pytest

import mkmodel
import ref
from sparktest import run_spark

SHAPE = dict(hidden=64, ff=128, layers=4, heads=4, kv_heads=1, head_dim=32, vocab=256, window=8, pattern="SSSF",
             seed=21)
IDS = [int(i) for i in np.random.default_rng(3).integers(0, 256, 30)]
TOL = 1e-5


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("hooks") / "m"
    mkmodel.make_model(str(d), **SHAPE)
    return d, ref.load_model(str(d))


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def logits(model_dir, tmp, *extra):
    out = tmp / "l.npy"
    run_spark(["logits", model_dir, "--ids", ",".join(map(str, IDS)), "--out", out, "--all", *extra])
    return np.load(out).astype(np.float64)


def directions(tmp, layers=(1, 3)):
    rng = np.random.default_rng(9)
    d = np.zeros((SHAPE["layers"], SHAPE["hidden"]), np.float32)
    for layer in layers:
        d[layer] = rng.normal(0, 1, SHAPE["hidden"])
    path = tmp / "dir.npy"
    np.save(path, d)
    return path, d.astype(np.float64)


steer_fn = ref.steer_modes  # the NumPy oracle of the four modes (tools/ref.py)


@pytest.mark.parametrize("mode,strength", [("add", 2.5), ("ablate", 1.0), ("ablate", 0.5), ("clamp", 3.0),
                                           ("renorm", 1.0)])
def test_steering_matches_reference(model, tmp_path, mode, strength):
    d_dir, m = model
    path, d = directions(tmp_path)
    got = logits(d_dir, tmp_path, "--steer", path, "--steer-mode", mode, "--steer-strength", strength)
    want = ref.forward(m, IDS, steer=steer_fn(d, mode, strength))
    plain = ref.forward(m, IDS)
    assert rel(want, plain) > 100 * TOL, "the steering must move the logits for this test to mean anything"
    for i in range(len(IDS)):
        assert rel(got[i], want[i]) <= TOL, (i, rel(got[i], want[i]))


def test_steer_layers_restricts(model, tmp_path):
    d_dir, m = model
    path, d = directions(tmp_path)
    got = logits(d_dir, tmp_path, "--steer", path, "--steer-layers", "3-3", "--steer-strength", "2")
    only3 = d.copy()
    only3[1] = 0
    want = ref.forward(m, IDS, steer=steer_fn(only3, "add", 2.0))
    assert max(rel(got[i], want[i]) for i in range(len(IDS))) <= TOL


def test_two_vectors_stack_in_order(model, tmp_path):
    d_dir, m = model
    path, d = directions(tmp_path, layers=(2,))
    got = logits(d_dir, tmp_path, "--steer", path, "--steer-strength", "1.5",
                 "--steer", path, "--steer-mode", "clamp", "--steer-strength", "0.7")
    f_add, f_clamp = steer_fn(d, "add", 1.5), steer_fn(d, "clamp", 0.7)
    want = ref.forward(m, IDS, steer=lambda layer, h: f_clamp(layer, f_add(layer, h)))
    assert max(rel(got[i], want[i]) for i in range(len(IDS))) <= TOL


def test_control_vector_gguf(model, tmp_path):
    import gguf
    d_dir, m = model
    path = tmp_path / "cv.gguf"
    w = gguf.GGUFWriter(str(path), "controlvector")
    rng = np.random.default_rng(4)
    vec = rng.normal(0, 1, SHAPE["hidden"]).astype(np.float32)
    w.add_tensor("direction.2", vec)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = logits(d_dir, tmp_path, "--steer", path, "--steer-strength", "1.3")
    d = np.zeros((SHAPE["layers"], SHAPE["hidden"]))
    d[2] = vec
    want = ref.forward(m, IDS, steer=steer_fn(d, "add", 1.3))
    assert max(rel(got[i], want[i]) for i in range(len(IDS))) <= TOL


def test_capture_matches_reference_hidden_states(model, tmp_path):
    d_dir, m = model
    cap = tmp_path / "cap.npy"
    logits(d_dir, tmp_path, "--capture", cap, "--capture-positions", "all")
    got = np.load(cap)
    want = ref.hidden_states(m, IDS)  # [n, layers, hidden]
    assert got.shape == want.shape and got.dtype == np.float32
    for p in range(len(IDS)):
        for layer in range(SHAPE["layers"]):
            assert rel(got[p, layer], want[p, layer]) <= TOL
    side = json.loads((tmp_path / "cap.json").read_text())
    assert side["prompt_ids"] == IDS and side["positions"] == list(range(len(IDS)))


def test_capture_last_position_and_layer_range_after_steering(model, tmp_path):
    d_dir, m = model
    path, d = directions(tmp_path)
    cap = tmp_path / "c2.npy"
    logits(d_dir, tmp_path, "--capture", cap, "--capture-layers", "1-2", "--steer", path)
    got = np.load(cap)
    want = ref.hidden_states(m, IDS, steer=steer_fn(d, "add", 1.0))[-1:, 1:3]
    assert got.shape == (1, 2, SHAPE["hidden"])
    assert rel(got, want) <= TOL


def test_ffn_statistics_match_numpy_and_leave_logits_alone(model, tmp_path):
    d_dir, m = model
    plain = logits(d_dir, tmp_path)
    stats = tmp_path / "ffn.json"
    k = 8
    with_hist = logits(d_dir, tmp_path, "--ffn-hist", stats, "--ffn-topk", k, "--capture", tmp_path / "c.npy",
                       "--timing")
    assert np.array_equal(plain, with_hist), "observing must not change the logits"
    acts = ref.ffn_activations(m, IDS)  # [layers, n, ff]
    info = json.loads(stats.read_text())
    mass = np.load(tmp_path / "ffn.npy")
    assert info["tokens"] == len(IDS)
    assert np.allclose(mass, np.abs(acts).sum(axis=1), rtol=1e-4)
    for layer, L in enumerate(info["layers"]):
        a = np.abs(acts[layer]).ravel()
        # bucket b holds [2^(b-48), 2^(b-47)); tolerate values within float32 rounding of an edge
        exp = np.floor(np.log2(a[a > 0])).astype(int) + 48
        want = np.bincount(np.clip(exp, 0, 63), minlength=64)
        want[0] += int((a == 0).sum())
        assert sum(L["histogram"]) == a.size
        assert np.abs(np.array(L["histogram"]) - want).sum() <= 2
        tops = [set(np.argsort(-np.abs(acts[layer, t]), kind="stable")[:k]) for t in range(len(IDS))]
        overlap = np.mean([len(tops[t] & tops[t - 1]) / k for t in range(1, len(IDS))])
        assert abs(L["topk_overlap"] - overlap) <= 1.0 / k / len(IDS) + 1e-9


def test_steer_extract_round_trip(model, tmp_path):
    """Directions from two prompt sets equal the difference of the reference's
    mean last-token hidden states; steering with them runs."""
    d_dir, m = model
    # the synthetic model has no tokenizer: use one made for it
    tok_dir = tmp_path / "with_tok"
    from conftest_models import tokenizer_dir
    mkmodel.make_model(str(tok_dir), tokenizer=str(tokenizer_dir()), **{k: v for k, v in SHAPE.items() if k != "vocab"})
    pos, neg = tmp_path / "pos.txt", tmp_path / "neg.txt"
    pos.write_text("joy and gladness\ngreat rejoicing in the land\n")
    neg.write_text("sorrow and mourning\nweeping in the night\n")
    out = tmp_path / "dir.npy"
    run_spark(["steer-extract", tok_dir, "--positive", pos, "--negative", neg, "--out", out])
    got = np.load(out)
    mt = ref.load_model(str(tok_dir))
    ids = lambda text: [int(x) for x in run_spark(["tokenize", tok_dir, "--text", text, "--json"]).stdout.strip()
                        .strip("[]").split(",")]
    mean = lambda lines: np.mean([ref.hidden_states(mt, ids(t))[-1] for t in lines], axis=0)
    want = mean(["joy and gladness", "great rejoicing in the land"]) - mean(["sorrow and mourning",
                                                                             "weeping in the night"])
    assert got.shape == want.shape
    assert rel(got, want) <= 1e-4
    run_spark(["run", "-m", tok_dir, "-p", "In the", "-n", "4", "--temp", "0", "--steer", out,
               "--steer-layers", "2-3"])


@pytest.mark.parametrize("args", [
    ["--steer-mode", "add"],
    ["--steer", "x.npy", "--steer-mode", "push"],
    ["--steer", "x.npy", "--steer-layers", "3-1"],
    ["--capture-positions", "some"],
    ["--ffn-topk", "0"],
])
def test_bad_instrument_flags(model, args):
    d_dir, _ = model
    run_spark(["logits", d_dir, "--ids", "1,2", "--out", "/tmp/x.npy", *args], expect_rc=2)


def test_bad_steering_files(model, tmp_path):
    d_dir, _ = model
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.ones((2, 5), np.float32))
    proc = run_spark(["logits", d_dir, "--ids", "1,2", "--out", tmp_path / "x.npy", "--steer", wrong], expect_rc=1)
    assert "wrong.npy" in proc.stderr and "[4, 64]" in proc.stderr
    proc = run_spark(["logits", d_dir, "--ids", "1,2", "--out", tmp_path / "x.npy", "--steer", tmp_path / "no.npy"],
                     expect_rc=1)
    assert "no.npy" in proc.stderr

"""Malformed checkpoints and bad requests: each must give exit status 1 and
one clear message naming the file and the tensor or field, never a crash
(run_spark fails the test on any sanitizer report or signal)."""
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import mkmodel
from sparktest import run_spark

SHAPE = dict(hidden=32, ff=64, layers=2, heads=2, kv_heads=1, head_dim=16, vocab=64, window=4, pattern="SF", seed=5)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    mkmodel.make_model(str(root / "hf"), gguf=str(root / "m.gguf"), **SHAPE)
    return root


def copy_hf(good, tmp_path):
    d = tmp_path / "hf"
    shutil.copytree(good / "hf", d)
    return d


def edit_tensors(d, fn):
    tensors = load_file(str(d / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(d / "model.safetensors"))


def edit_config(d, fn):
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


def expect_error(model, *needles, args=("inspect",)):
    proc = run_spark([args[0], model, *args[1:]], expect_rc=1)
    for needle in needles:
        assert needle in proc.stderr, f"stderr lacks {needle!r}: {proc.stderr}"
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
    return proc.stderr


def test_good_model_loads(good):
    run_spark(["inspect", good / "hf"])
    run_spark(["inspect", good / "m.gguf"])


def test_missing_tensor(good, tmp_path):
    d = copy_hf(good, tmp_path)
    edit_tensors(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    expect_error(d, "model.layers.1.mlp.up_proj.weight", "missing")


def test_wrong_shape(good, tmp_path):
    d = copy_hf(good, tmp_path)
    name = "model.layers.0.self_attn.g_proj.weight"
    edit_tensors(d, lambda t: t.__setitem__(name, np.zeros((3, 32), np.float32)))
    expect_error(d, name, "[3, 32]", "[2, 32]")


def test_unknown_dtype(good, tmp_path):
    d = copy_hf(good, tmp_path)
    name = "model.layers.0.mlp.down_proj.weight"
    edit_tensors(d, lambda t: t.__setitem__(name, t[name].astype(np.float64)))
    expect_error(d, name, "F64")


@pytest.mark.parametrize("field,value,needle", [
    ("hidden_act", "gelu_pytorch_tanh", "hidden_act"),
    ("gate_attn_act_mode", "softmax", "gate_attn_act_mode"),
    ("headwise_attn_output_gate", False, "headwise_attn_output_gate"),
    ("attention_bias", True, "attention_bias"),
    ("model_type", "llama", "model_type"),
    ("layer_types", ["sliding_attention", "linear_attention"], "linear_attention"),
    ("num_key_value_heads", 3, "kv heads"),
])
def test_config_the_runtime_cannot_honour(good, tmp_path, field, value, needle):
    d = copy_hf(good, tmp_path)
    edit_config(d, lambda c: c.__setitem__(field, value))
    expect_error(d, "config.json", needle)


def test_untied_head_without_lm_head(good, tmp_path):
    d = copy_hf(good, tmp_path)
    edit_config(d, lambda c: c.__setitem__("tie_word_embeddings", False))
    expect_error(d, "lm_head.weight", "tie_word_embeddings")


def test_missing_config_field(good, tmp_path):
    d = copy_hf(good, tmp_path)
    edit_config(d, lambda c: c.pop("rope_parameters"))
    expect_error(d, "config.json", "rope_parameters")


def test_missing_config_file(good, tmp_path):
    d = copy_hf(good, tmp_path)
    (d / "config.json").unlink()
    expect_error(d, "config.json")


def test_gguf_truncated(good, tmp_path):
    data = (good / "m.gguf").read_bytes()
    for cut in (10, 200, len(data) // 2, len(data) - 7):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        expect_error(p, str(p))


def test_wrong_magic(good, tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUX" + (good / "m.gguf").read_bytes()[4:])
    expect_error(p, str(p), "GGUF")


def test_nonexistent_path(tmp_path):
    expect_error(tmp_path / "nope", "nope")


def test_context_overflow_is_an_error(good, tmp_path):
    ids = ",".join(["1"] * 20)
    err = expect_error(good / "hf", "context", args=("logits", "--ids", ids, "--out", tmp_path / "x.npy", "--ctx", "10"))
    assert "20" in err and "10" in err


def test_id_outside_vocab(good, tmp_path):
    expect_error(good / "hf", "64", "vocabulary", args=("logits", "--ids", "1,64", "--out", tmp_path / "x.npy"))


@pytest.mark.parametrize("args", [
    ["logits"],
    ["logits", "M", "--ids", "1,x", "--out", "o.npy"],
    ["logits", "M", "--ids", "1", "--out", "o.npy", "--mode", "fast"],
    ["logits", "M", "--ids", "1", "--out", "o.npy", "--ctx", "-3"],
    ["logits", "M", "--bogus"],
    ["inspect"],
    ["inspect", "M", "--bogus"],
    ["frobnicate"],
])
def test_bad_usage_exits_2(args):
    proc = run_spark(args, expect_rc=2)
    assert proc.stderr.strip(), "no message"

"""The C forward pass against tools/ref.py, the independent float64 NumPy
reference written from SPEC §2, on synthetic models made by tools/mkmodel.py.

Budget: relative L2 error <= 1e-5 per position. The C path computes in
float32 with float32 weights, so the error is float32 rounding accumulated
over a few layers (measured ~1e-6..3e-6). bf16 and f16 weights convert to
float32 exactly, so the same budget holds for them: the reference upcasts the
same stored values to float64.
"""
import numpy as np
import pytest

import mkmodel
import ref
from sparktest import SYNTH_SHAPES, run_spark

TOL = 1e-5

SHAPES = SYNTH_SHAPES


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def prompt_ids(vocab, n, seed):
    return [int(i) for i in np.random.default_rng(seed + 100).integers(0, vocab, n)]


class Built:
    """A synthetic model written as an HF dir and a GGUF file, plus its prompt."""

    def __init__(self, root, name, dtype="f32", **shape):
        shape = dict(shape)
        n = shape.pop("prompt")
        self.hf = root / f"{name}-{dtype}"
        self.gguf = root / f"{name}-{dtype}.gguf"
        self.cfg = mkmodel.make_model(str(self.hf), dtype=dtype, gguf=str(self.gguf), **shape)
        self.ids = prompt_ids(shape["vocab"], n, shape["seed"])
        self.ref_model = ref.load_model(str(self.hf))
        self._ref = None

    @property
    def ref_logits(self):
        if self._ref is None:
            self._ref = ref.forward(self.ref_model, self.ids)
        return self._ref

    def spark(self, tmp, *extra, model=None, ids=None):
        out = tmp / "logits.npy"
        ids = self.ids if ids is None else ids
        run_spark(["logits", model or self.hf, "--ids", ",".join(map(str, ids)), "--out", out, *extra])
        return np.load(out).astype(np.float64)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: Built(root, name, **shape) for name, shape in SHAPES.items()}


def check_positions(got, want, tol=TOL):
    assert got.shape == want.shape
    errs = [rel_l2(got[i], want[i]) for i in range(len(want))]
    worst = int(np.argmax(errs))
    assert errs[worst] <= tol, f"position {worst}: relative L2 {errs[worst]:.3g} > {tol}"
    return max(errs)


@pytest.mark.parametrize("name", SHAPES)
def test_prefill_matches_reference(models, name, tmp_path):
    m = models[name]
    check_positions(m.spark(tmp_path, "--all"), m.ref_logits)


@pytest.mark.parametrize("name", SHAPES)
def test_decode_matches_reference_and_prefill(models, name, tmp_path):
    m = models[name]
    decode = m.spark(tmp_path, "--all", "--mode", "decode")
    check_positions(decode, m.ref_logits)
    prefill = m.spark(tmp_path, "--all")
    check_positions(decode, prefill)


@pytest.mark.parametrize("batch", [1, 5, 7, 13])
def test_chunked_prefill_matches_one_chunk(models, batch, tmp_path):
    m = models["gqa4_w8"]
    whole = m.spark(tmp_path, "--all")
    chunked = m.spark(tmp_path, "--all", "--batch", batch)
    check_positions(chunked, whole)


def test_last_position_only(models, tmp_path):
    m = models["mha_w16"]
    last = m.spark(tmp_path)
    assert last.shape == (1, m.cfg["vocab_size"])
    check_positions(last, m.ref_logits[-1:])


@pytest.mark.parametrize("name", SHAPES)
def test_hf_and_gguf_give_identical_logits(models, name, tmp_path):
    m = models[name]
    hf = m.spark(tmp_path, "--all")
    gg = m.spark(tmp_path, "--all", model=m.gguf)
    assert np.array_equal(hf, gg), f"max |diff| {np.max(np.abs(hf - gg))}"


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_precision_weights_match_reference(tmp_path_factory, dtype, tmp_path):
    m = Built(tmp_path_factory.mktemp(dtype), "gqa4", dtype=dtype, **SHAPES["gqa4_w8"])
    check_positions(m.spark(tmp_path, "--all"), m.ref_logits)
    check_positions(m.spark(tmp_path, "--all", model=m.gguf), m.ref_logits)


def test_rope_class_swap_must_matter(tmp_path_factory, tmp_path):
    """A model built so the two rope classes differ a lot (8 of 32 dims at 5e6
    vs all 32 at 1e4) and positions reach far: the reference's swapped variant
    moves the logits far beyond the budget, and the C path matches the
    unswapped reference, so the C path cannot be using the swapped classes."""
    shape = dict(SHAPES["gqa4_w8"], pattern="SF", theta_full=5e6, theta_sliding=1e4, seed=11)
    m = Built(tmp_path_factory.mktemp("swap"), "swap", **shape)
    swapped = ref.forward(m.ref_model, m.ids, variant="rope_swap")
    moved = min(rel_l2(swapped[i], m.ref_logits[i]) for i in range(8, len(m.ids)))
    assert moved > 100 * TOL, f"the swap moves logits by only {moved:.3g}"
    check_positions(m.spark(tmp_path, "--all"), m.ref_logits)


def test_inspect_reports_the_config(models):
    import json
    m = models["gqa4_8layers_w12"]
    for path in (m.hf, m.gguf):
        info = json.loads(run_spark(["inspect", path, "--json"]).stdout)
        assert info["hidden_size"] == 96 and info["num_layers"] == 8 and info["head_dim"] == 16
        assert info["num_heads"] == 8 and info["num_kv_heads"] == 2 and info["sliding_window"] == 12
        assert info["layer_pattern"] == "SSSFSSSF"
        assert info["rope_dims_full"] == 4 and info["rope_dims_sliding"] == 16
        assert info["rope_theta_full"] == 5e6 and info["rope_theta_sliding"] == 1e4
        # 2 full layers x 2 (k, v) x 2 kv heads x 16 dims x 4 bytes
        assert info["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4
    text = run_spark(["inspect", m.hf]).stdout
    assert "SSSFSSSF" in text and "KV cache" in text


def test_sharded_and_alias_names_load_identically(models, tmp_path_factory, tmp_path):
    """The same seeded weights written as 3 shards with the alias names
    (model.embed_tokens, o_proj) give bit-identical logits."""
    shape = dict(SHAPES["gqa4_w8"])
    shape.pop("prompt")
    d = tmp_path_factory.mktemp("shards") / "m"
    mkmodel.make_model(str(d), shards=3, alias=True, **shape)
    assert (d / "model.safetensors.index.json").exists()
    m = models["gqa4_w8"]
    assert np.array_equal(m.spark(tmp_path, "--all", model=d), m.spark(tmp_path, "--all"))


def test_untied_head_is_used(tmp_path_factory, tmp_path):
    shape = dict(SHAPES["mha_w16"], untied=True)
    m = Built(tmp_path_factory.mktemp("untied"), "untied", **shape)
    check_positions(m.spark(tmp_path, "--all"), m.ref_logits)

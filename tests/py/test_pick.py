"""Token choice where the logits are (engine/generate.c; backend.h's pick and
candidates ops): greedy generation through the backend's pick, and sampling
from the backend's candidates, must give the host sampler's tokens, whatever
ends the generation, on the CPU and (where there is a device) on the GPU,
whose next greedy step is issued before the host reads the pick and is taken
back when that pick ends the reply.

SPARK_PICK=0 forces the host path (logits copied out, spark_sampler_sample);
the default takes the pick for a plain greedy sampler and the candidates for
any other sampler without bias or penalties. SPARK_SAMPLE_CAP shrinks the
candidates the backend may hand over, so the runs below also take the paths
where they are a head of the distribution only and where they do not
suffice (the host then samples the full logits)."""
import json
import numpy as np
import pytest

import mkmodel
from sparktest import ROOT, require_gpu, run_spark

TINY = ROOT / "models" / "spark-tiny"
PROMPT = "And God said,"

# what ends each run: the length, a stop string (mid-token too), the context
ENDINGS = {
    "length": ["-n", "48"],
    "stop": ["-n", "64", "--stop", "the"],
    "stop-mid": ["-n", "64", "--stop", "d th"],
    "context": ["-n", "-1", "-c", "40", "--ignore-eos"],
}


def run_text(args, pick, monkeypatch):
    if pick:
        monkeypatch.delenv("SPARK_PICK", raising=False)
    else:
        monkeypatch.setenv("SPARK_PICK", "0")
    return run_spark(args).stdout


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    return require_gpu(tmp_path_factory)


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_cpu_pick_equals_host_sampler(ending, monkeypatch):
    args = ["run", "-m", TINY, "-p", PROMPT, "--temp", "0", *ENDINGS[ending]]
    host = run_text(args, False, monkeypatch)
    assert len(host.strip()) > 0
    assert run_text(args, True, monkeypatch) == host


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_gpu_pick_equals_host_path_and_cpu(gpu, ending, monkeypatch):
    args = ["run", "-m", TINY, "-p", PROMPT, "--temp", "0", *ENDINGS[ending]]
    cpu = run_text(args, False, monkeypatch)
    host = run_text(args + ["--gpu"], False, monkeypatch)
    pick = run_text(args + ["--gpu"], True, monkeypatch)
    assert host == cpu, f"GPU (host sampler) differs from CPU:\n{cpu!r}\n{host!r}"
    assert pick == cpu, f"GPU (device pick) differs from CPU:\n{cpu!r}\n{pick!r}"


SAMPLING = {
    "top-p": ["--temp", "1", "--top-p", "0.95"],
    "top-k": ["--temp", "0.7", "--top-k", "40"],
    "min-p": ["--temp", "1.3", "--top-p", "0.9", "--min-p", "0.02"],
    "plain": ["--temp", "1"],
    "all": ["--temp", "0.8", "--top-k", "20", "--top-p", "0.8"],
}
CAPS = ["", "4", "64", "300"]


def sample_text(args, cap, monkeypatch):
    if cap is None:
        monkeypatch.setenv("SPARK_PICK", "0")
    else:
        monkeypatch.delenv("SPARK_PICK", raising=False)
    if cap:
        monkeypatch.setenv("SPARK_SAMPLE_CAP", cap)
    else:
        monkeypatch.delenv("SPARK_SAMPLE_CAP", raising=False)
    return run_spark(args).stdout


@pytest.mark.parametrize("how", sorted(SAMPLING))
def test_cpu_candidates_equal_host_sampler(how, monkeypatch):
    """Seeded sampling: the same text from the candidates (every cap) as
    from the host sampler over all logits."""
    args = ["run", "-m", TINY, "-p", PROMPT, "-n", "40", "--seed", "7", *SAMPLING[how]]
    host = sample_text(args, None, monkeypatch)
    assert len(host.strip()) > 0
    for cap in CAPS:
        assert sample_text(args, cap, monkeypatch) == host, f"cap {cap!r}"


@pytest.mark.parametrize("how", sorted(SAMPLING))
def test_gpu_candidates_equal_host_sampler(gpu, how, monkeypatch):
    """On the GPU the candidates' total weight is summed in another order
    than the host's (a rounding's difference, which could move a top-p cut
    only if the target fell within it), the rest is the host's arithmetic:
    the text must equal the GPU's own host-sampler path."""
    args = ["run", "-m", TINY, "-p", PROMPT, "-n", "40", "--seed", "7", "--gpu", *SAMPLING[how]]
    host = sample_text(args, None, monkeypatch)
    for cap in CAPS:
        assert sample_text(args, cap, monkeypatch) == host, f"cap {cap!r}"


def chat(extra, pick, monkeypatch):
    if pick:
        monkeypatch.delenv("SPARK_PICK", raising=False)
    else:
        monkeypatch.setenv("SPARK_PICK", "0")
    turns = "Who made the light?\nAnd then?\nTell me of the waters.\n"
    proc = run_spark(["chat", "-m", TINY, "--temp", "0", "--no-think", "-n", "40", "--stop", "the", *extra],
                     input=turns)
    assert proc.stderr.count("generated:") == 3, proc.stderr  # three replies
    return proc.stdout


def test_gpu_chat_turns_after_taken_back_steps(gpu, monkeypatch):
    """Every reply ends at a stop string, so on the GPU the step issued for
    its last token is taken back; the next turn continues the same cache and
    must read as on the CPU."""
    cpu = chat([], False, monkeypatch)
    assert len(cpu) > 12, cpu
    assert chat(["--gpu"], True, monkeypatch) == cpu
    assert chat([], True, monkeypatch) == cpu


def tie_model(tmp, lo, hi):
    """A spark-tiny-shaped model (its tokenizer) whose layer matrices are all
    zero, so h stays the last token's embedding row and the logits are
    E @ (rmsnorm(E[t]) * w): with E[hi] = E[lo] the rows lo and hi score
    exactly the same. Returns the path and, from float64, the margin by
    which their score leads every other row's for the inputs lo and hi."""
    cfg = mkmodel.build_config(hidden=64, ff=128, layers=2, heads=4, kv_heads=1, head_dim=32, window=16,
                               vocab=6144, seed=3)
    w = mkmodel.make_weights(cfg, 3, "f32")
    for name in w:
        if name.startswith("model.layers.") and not name.endswith("layernorm.weight"):
            w[name] = np.zeros_like(w[name])
    emb = "model.embedding.weight"
    w[emb][hi] = w[emb][lo]
    path = tmp / "tie"
    mkmodel.write_hf(path, cfg, w, "f32", tokenizer=str(TINY))
    E = w[emb].astype(np.float64)
    fw = w["model.norm.weight"].astype(np.float64)
    x = E[lo] / np.sqrt(np.mean(E[lo] ** 2) + 1e-6) * fw
    z = E @ x
    others = np.delete(z, [lo, hi])
    return path, float(z[lo] - others.max())


def tie_case(tmp):
    vocab = json.loads((TINY / "tokenizer.json").read_text())["model"]["vocab"]
    lo, hi = vocab["a"], vocab["b"]
    assert lo < hi
    path, margin = tie_model(tmp, lo, hi)
    assert margin > 1.0, f"the tied rows lead by only {margin}: the case cannot show the rule"
    return ["run", "-m", path, "-p", "b", "-n", "6", "--temp", "0"], "a" * 6


def test_a_tie_goes_to_the_smaller_id(tmp_path, monkeypatch):
    """'a' and 'b' (the next id) get the same embedding row: after "b" the
    two lead with equal logits, and the greedy rule (the first index of the
    largest) says "a" every time."""
    args, want = tie_case(tmp_path)
    assert run_text(args, False, monkeypatch).rstrip("\n") == want
    assert run_text(args, True, monkeypatch).rstrip("\n") == want


def test_a_tie_goes_to_the_smaller_id_on_the_gpu(gpu, tmp_path, monkeypatch):
    args, want = tie_case(tmp_path)
    assert run_text(args + ["--gpu"], False, monkeypatch).rstrip("\n") == want
    assert run_text(args + ["--gpu"], True, monkeypatch).rstrip("\n") == want

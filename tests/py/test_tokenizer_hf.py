"""The tokenizer against HF `tokenizers` (the reference): ids on a generated
corpus of >= 10,000 strings for (a) the real Spark-X2.5 tokenizer and (b) the
trained 131,072-id Spark-style fixture; GGUF-embedded copies; round trips,
streaming decode; invalid UTF-8; CLI errors."""
import json

import pytest
from tokenizers import Tokenizer

from sparktest import ROOT, run_spark
from tok_corpus import make_corpus
from tok_helpers import (added_contents, fixture_json, real_dir, report, spark_decode_batch,
                         spark_encode_batch)

N_CORPUS = 12000


@pytest.fixture(scope="module")
def fixture_path(tmp_path_factory):
    return fixture_json(tmp_path_factory.mktemp("tok"))


TINY_JSON = ROOT / "models" / "spark-tiny" / "tokenizer.json"


def sources(which, fixture_path):
    """(model path for spark, path of the oracle tokenizer.json)."""
    if which == "real":
        d = real_dir()
        return d / "tokenizer.json", d / "tokenizer.hf.json"
    if which == "tiny":
        if not TINY_JSON.exists():
            pytest.skip(f"{TINY_JSON} not trained yet (models/spark-tiny)")
        return TINY_JSON, TINY_JSON
    return fixture_path, fixture_path


def corpus_for(oracle_json):
    return make_corpus(N_CORPUS, seed=1234, added=added_contents(oracle_json))


def first_mismatches(corpus, want, got, k=5):
    bad = [i for i in range(len(corpus)) if want[i] != got[i]]
    lines = [f"{corpus[i]!r:.120}\n  hf    {want[i][:24]}\n  spark {got[i][:24]}" for i in bad[:k]]
    return bad, "\n".join(lines)


def test_real_test_vectors():
    d = real_dir()
    for model in (d, d / "tokenizer.json"):
        out = run_spark(["tokenize", model, "--text", "The capital of France is", "--json"]).stdout
        assert json.loads(out) == [1046, 11862, 314, 17349, 390]
        assert json.loads(run_spark(["tokenize", model, "--text", " Paris", "--json"]).stdout) == [19500]


@pytest.mark.parametrize("which", ["real", "fixture", "tiny"])
def test_agreement_with_hf(which, fixture_path):
    model, oracle = sources(which, fixture_path)
    corpus = corpus_for(oracle)
    assert len(corpus) >= 10000
    want = [e.ids for e in Tokenizer.from_file(str(oracle)).encode_batch(corpus)]
    got = spark_encode_batch(model, corpus)
    bad, shown = first_mismatches(corpus, want, got)
    report(f"agreement[{which}]", f"{len(corpus) - len(bad)}/{len(corpus)} strings give identical ids")
    assert not bad, f"{len(bad)} mismatches, first ones:\n{shown}"


@pytest.mark.parametrize("which", ["real", "fixture"])
def test_plain_specials_match_hf_without_added_tokens(which, fixture_path, tmp_path):
    """--plain-specials: added-token text is ordinary text, i.e. what HF gives
    when the file lists no added tokens."""
    model, oracle = sources(which, fixture_path)
    doc = json.load(open(oracle, encoding="utf-8"))
    doc["added_tokens"] = []
    plain_oracle = tmp_path / "no_added.json"
    plain_oracle.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    corpus = [s for s in corpus_for(oracle) if "<" in s]
    want = [e.ids for e in Tokenizer.from_file(str(plain_oracle)).encode_batch(corpus)]
    got = spark_encode_batch(model, corpus, plain=True)
    bad, shown = first_mismatches(corpus, want, got)
    report(f"plain-specials[{which}]", f"{len(corpus) - len(bad)}/{len(corpus)} identical")
    assert not bad, shown
    assert any(130973 in ids for ids in spark_encode_batch(model, ["a<|User|>b"]))
    assert all(130973 not in ids for ids in got)


@pytest.mark.parametrize("which", ["real", "fixture"])
def test_round_trip_and_streaming(which, fixture_path):
    model, oracle = sources(which, fixture_path)
    corpus = corpus_for(oracle)[:4000]
    ids = spark_encode_batch(model, corpus)
    assert spark_decode_batch(model, ids) == corpus
    hf = Tokenizer.from_file(str(oracle))
    assert spark_decode_batch(model, ids) == hf.decode_batch(ids, skip_special_tokens=False)
    assert spark_decode_batch(model, ids, skip_special=True) == hf.decode_batch(ids, skip_special_tokens=True)
    # Streaming: every prefix's output is valid UTF-8 (strict decoding in the
    # helper) and the chunks add up to the whole text.
    chunks = spark_decode_batch(model, ids, stream=True)
    for s, ch, i in zip(corpus, chunks, ids):
        assert "".join(ch) == s
        assert len(ch) == len(i) + 1  # one chunk per id, plus the flush


def test_streaming_splits_characters_without_breaking_them():
    d = real_dir()
    text = "中文😀👨‍👩‍👧 é"
    ids = spark_encode_batch(d, [text])[0]
    chunks = spark_decode_batch(d, [ids], stream=True)[0]
    assert "".join(chunks) == text
    assert len(chunks) == len(ids) + 1  # one chunk per push, plus the flush
    assert "" in chunks  # some id ended inside a character and was held back
    # Ids cut in the middle of a character: the prefix decodes to U+FFFD in
    # both the whole decode and the stream, like HF.
    hf = Tokenizer.from_file(str(d / "tokenizer.hf.json"))
    for k in range(1, len(ids) + 1):
        whole = spark_decode_batch(d, [ids[:k]])[0]
        assert whole == hf.decode(ids[:k])
        assert "".join(spark_decode_batch(d, [ids[:k]], stream=True)[0]) == whole


def test_invalid_utf8_is_replaced_like_python(tmp_path):
    """Documented choice: each maximal invalid subsequence becomes U+FFFD,
    exactly bytes.decode('utf-8', 'replace'), then encoding proceeds."""
    d = real_dir()
    hf = Tokenizer.from_file(str(d / "tokenizer.hf.json"))
    cases = [b"abc\xff def", b"\xc3", b"\xe4\xb8", b"\xe4\xb8\xad\xe4", b"\xed\xa0\x80 surrogate",
             b"\xf4\x90\x80\x80 too big", b"\xc0\xaf overlong", b"ok \xf0\x9f\x98 cut emoji", b"\x80\x80\x80",
             b"mixed \xe2\x82\xac \xe2\x82 end"]
    for raw in cases:
        import subprocess
        from sparktest import SPARK_BIN
        proc = subprocess.run([SPARK_BIN, "tokenize", str(d), "--text", raw, "--json"], capture_output=True)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == hf.encode(raw.decode("utf-8", "replace")).ids, raw


def test_bad_input_gives_clean_errors(tmp_path):
    d = real_dir()
    for args, rc, needle in [
        (["tokenize", d, "--text", "x", "--bogus"], 2, "--bogus"),
        (["tokenize", d], 2, "--text"),
        (["tokenize", "--text", "x"], 2, "MODEL"),
        (["tokenize", tmp_path / "missing", "--text", "x"], 1, "missing"),
        (["detokenize", d, "--ids", "1,zz"], 2, "--ids"),
        (["detokenize", d, "--ids", "131072"], 1, "131072"),
        (["detokenize", d, "--ids", "-5"], 1, "-5"),
        (["chat-template", d, "--messages", tmp_path / "none.json"], 1, "none.json"),
        (["chat-template", d], 2, "--messages"),
    ]:
        proc = run_spark(args, expect_rc=rc)
        assert needle in proc.stderr, (args, proc.stderr)
        if rc == 2:
            assert len(proc.stderr.strip().splitlines()) == 1
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    assert "not valid JSON" in run_spark(["tokenize", bad_json, "--text", "x"], expect_rc=1).stderr
    truncated = tmp_path / "t.json"
    truncated.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                     "pre_tokenizer": {"type": "Whitespace"}}))
    assert "not supported" in run_spark(["tokenize", truncated, "--text", "x"], expect_rc=1).stderr
    for cmd in ("tokenize", "detokenize", "chat-template"):
        assert "usage" in run_spark([cmd, "--help"]).stdout

"""GGUF-embedded and tokenizer.json-loaded copies of one tokenizer give
identical ids (SPEC §4 keys: tokenizer.ggml.model "gpt2", pre "spark2_5",
tokens, token_type, merges, bos/eos/padding ids, add_bos_token false).

The GGUF is written here with the `gguf` package, tokenizer metadata only,
from the same tokenizer.json (for the real one: the published file, dead
merge included, which the loader must skip in both formats)."""
import json

import pytest

from sparktest import run_spark
from tok_corpus import make_corpus
from tok_helpers import added_contents, fixture_json, real_dir, report, spark_encode_batch

gguf = pytest.importorskip("gguf")


def write_tokenizer_gguf(tokenizer_json, path):
    doc = json.load(open(tokenizer_json, encoding="utf-8"))
    by_id = {i: t for t, i in doc["model"]["vocab"].items()}
    types = {}
    for a in doc["added_tokens"]:
        by_id[a["id"]] = a["content"]
        types[a["id"]] = 3 if a["special"] else 4  # control / user-defined (llama.cpp)
    n = max(by_id) + 1
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n)]
    token_type = [types.get(i, 1 if i in by_id else 5) for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "spark2_5")
    T = gguf.GGUFValueType
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "spark2_5")
    w.add_key_value("tokenizer.ggml.tokens", tokens, T.ARRAY, sub_type=T.STRING)
    w.add_key_value("tokenizer.ggml.token_type", token_type, T.ARRAY, sub_type=T.INT32)
    w.add_key_value("tokenizer.ggml.merges", merges, T.ARRAY, sub_type=T.STRING)
    w.add_uint32("tokenizer.ggml.bos_token_id", 0)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    w.add_uint32("tokenizer.ggml.padding_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("which", ["real", "fixture"])
def test_gguf_and_json_give_identical_ids(which, tmp_path):
    src = real_dir() / "tokenizer.json" if which == "real" else fixture_json(tmp_path)
    path = write_tokenizer_gguf(src, tmp_path / "tok.gguf")
    corpus = make_corpus(12000, seed=99, added=added_contents(src))
    from_json = spark_encode_batch(src, corpus)
    from_gguf = spark_encode_batch(path, corpus)
    same = sum(a == b for a, b in zip(from_json, from_gguf))
    report(f"gguf-vs-json[{which}]", f"{same}/{len(corpus)} identical")
    assert same == len(corpus)
    plain_json = spark_encode_batch(src, corpus[:2000], plain=True)
    assert plain_json == spark_encode_batch(path, corpus[:2000], plain=True)
    if which == "real":
        out = run_spark(["tokenize", path, "--text", "The capital of France is", "--json"]).stdout
        assert json.loads(out) == [1046, 11862, 314, 17349, 390]
    # Decoding through the GGUF copy gives the text back too.
    text = "<|User|>héllo 中文 😀<｜end▁of▁sentence｜>"
    ids = json.loads(run_spark(["tokenize", path, "--text", text, "--json"]).stdout)
    assert json.loads(run_spark(["detokenize", path, "--ids", ",".join(map(str, ids)), "--json"]).stdout)["text"] == text


def test_gguf_with_other_pre_tokenizer_is_refused(tmp_path):
    d = real_dir()
    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), "spark2_5")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_key_value("tokenizer.ggml.tokens", ["a", "b"], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    err = run_spark(["tokenize", path, "--text", "ab"], expect_rc=1).stderr
    assert "qwen2" in err and "tokenizer.ggml.pre" in err
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(path.read_bytes()[:40])
    run_spark(["tokenize", trunc, "--text", "ab"], expect_rc=1)

#!/usr/bin/env python3
"""Train spark-tiny's byte-level BPE tokenizer: Spark's rules, a small vocabulary.

Everything except the vocabulary and merges is Spark-X2.5's own: the normalizer,
pre-tokenizer (SPEC §5: numbers 1-3, CJK runs, the word/punctuation regex, single
digits, then the GPT-2 byte alphabet), post-processor and decoder are copied verbatim
from shared/tokenizers/spark-x2.5/tokenizer_meta.json, and so are the added tokens'
contents and flags. Only the merges are learnt, on the TRAINING split alone.

Id layout (VOCAB = 6144 by default), laid out the way the real vocabulary is:
  0 .. 13              the real model's added tokens 0..13, same ids, contents and flags
                       (0 BOS, 1 EOS, 2 pad, 3 <think>, 4 </think>, 5 <unk>, ...)
  14 .. 269            the 256 byte symbols, in byte order 0x00..0xFF (the real file has
                       242 of them at 14..255; here every byte has an id)
  270 .. VOCAB-14      the token made by merge i is id 270 + i (as in the real file,
                       where it is 256 + i)
  VOCAB-13 .. VOCAB-1  the role and tool tokens, in the real ids' order (real 130972..
                       130984): <|System|> <|User|> <|Tool|> <|Developer|> <|Bot|>
                       <tool_call> <tool_response> </tool_response> <arg_key>
                       </arg_key> <arg_value> </arg_value> </tool_call>
The real file's <||unusedN||> placeholders are left out: nothing uses them.

Writes OUTDIR/tokenizer.json and OUTDIR/tokenizer_config.json (bos/eos/pad strings,
add_bos_token false, and a chat_template written from SPEC §6).

Usage: python3 tools/train/train_tokenizer.py [--vocab 6144] [--data tools/train/data]
                                              [--meta PATH] [--out OUTDIR]
"""
import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, trainers

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_META = ROOT.parent / "shared" / "tokenizers" / "spark-x2.5" / "tokenizer_meta.json"
ROLE_FIRST_REAL_ID, ROLE_LAST_REAL_ID = 130972, 130984

# SPEC §6 as a Jinja template. The system turn is always emitted; past reasoning is
# dropped; consecutive tool results share one <|Tool|> turn. SPEC §6 does not give the
# layout of the tools block, so the one here (a heading, then one JSON schema per line)
# is this project's own choice, not Spark's published one.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'system' -%}"
    "{%- set ns.system = m['content'] -%}{%- endif -%}{%- endfor -%}"
    "<｜start▁of▁sentence｜><|System|>\nyou are a helpful assistant."
    "{%- if tools -%}{{ '\\n\\n# Tools' }}{%- for t in tools -%}{{ '\\n' }}{{ t | tojson }}{%- endfor -%}{%- endif -%}"
    "{%- if ns.system %}\n\n{{ ns.system }}{%- endif -%}"
    "<｜end▁of▁sentence｜>"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}"
    "<｜start▁of▁sentence｜><|User|>{{ m['content'] }}<｜end▁of▁sentence｜>"
    "{%- elif m['role'] == 'assistant' -%}"
    "<｜start▁of▁sentence｜><|Bot|></think>"
    "{%- set c = m['content'] or '' -%}"
    "{%- if '</think>' in c -%}{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
    "{{ c }}"
    "{%- for tc in m.get('tool_calls') or [] -%}"
    "{%- set f = tc['function'] if tc.get('function') else tc -%}"
    "<tool_call>{{ f['name'] }}"
    "{%- set args = f['arguments'] -%}"
    "{%- if args is string -%}{{ args }}"
    "{%- elif args is mapping -%}{%- for k, v in args.items() -%}"
    "<arg_key>{{ k }}</arg_key><arg_value>"
    "{%- if v is string -%}{{ v }}{%- else -%}{{ v | tojson }}{%- endif -%}"
    "</arg_value>{%- endfor -%}{%- endif -%}"
    "</tool_call>"
    "{%- endfor -%}"
    "<｜end▁of▁sentence｜>"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' -%}<｜start▁of▁sentence｜><|Tool|>{%- endif -%}"
    "<tool_response>{{ m['content'] }}</tool_response>"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' -%}<｜end▁of▁sentence｜>{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<｜start▁of▁sentence｜><|Bot|>"
    "{%- if enable_thinking is defined and not enable_thinking -%}</think>{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)


def byte_symbols():
    """GPT-2's byte -> printable character map (the alphabet ByteLevel uses)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=6144)
    ap.add_argument("--data", default=str(Path(__file__).parent / "data"))
    ap.add_argument("--meta", default=str(DEFAULT_META))
    ap.add_argument("--out", default=str(Path(__file__).parent / "data"))
    args = ap.parse_args()
    meta = json.loads(Path(args.meta).read_text(encoding="utf-8"))
    head = [t for t in meta["added_tokens"] if t["id"] <= 13]
    roles = [t for t in meta["added_tokens"] if ROLE_FIRST_REAL_ID <= t["id"] <= ROLE_LAST_REAL_ID]
    assert [t["id"] for t in head] == list(range(14)) and len(roles) == 13
    n_head, n_bytes, n_roles = len(head), 256, len(roles)
    n_merges = args.vocab - n_head - n_bytes - n_roles
    assert n_merges > 0

    # 1. Learn merges with Spark's own pre-tokenizer, on an empty BPE model. The specials
    # are passed to the trainer only so that they are never split into merges.
    skeleton = {k: meta[k] for k in ("version", "truncation", "padding", "normalizer",
                                     "pre_tokenizer", "post_processor", "decoder")}
    skeleton["added_tokens"] = []
    skeleton["model"] = dict(meta["model"], vocab={}, merges=[])
    tok = Tokenizer.from_str(json.dumps(skeleton))
    symbols = byte_symbols()
    trainer = trainers.BpeTrainer(
        vocab_size=n_bytes + n_merges, min_frequency=2, show_progress=False,
        initial_alphabet=symbols, special_tokens=[])
    train_text = (Path(args.data) / "train.txt").read_text(encoding="utf-8")
    # One chapter per training "document" keeps memory small and changes no counts:
    # the pre-tokenizer never joins text across a newline anyway.
    docs = train_text.split("\n\n")
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    learnt = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, list) else m.split(" ") for m in learnt["merges"]]
    assert len(merges) == n_merges, (len(merges), n_merges)

    # 2. Lay the ids out like the real vocabulary (see the module docstring).
    vocab = {}
    for b, s in enumerate(symbols):
        vocab[s] = n_head + b
    for i, (a, b) in enumerate(merges):
        assert a in vocab and b in vocab, (a, b)
        vocab[a + b] = n_head + n_bytes + i
    assert len(vocab) == n_bytes + n_merges, "a merge made a token twice"
    added = [dict(t) for t in head]
    for i, t in enumerate(roles):
        added.append(dict(t, id=args.vocab - n_roles + i))
    # Added tokens sit in the model's vocab too (as in the real file), at their own ids.
    for t in added:
        vocab[t["content"]] = t["id"]
    assert sorted(vocab.values()) == list(range(args.vocab))

    full = dict(skeleton)
    full["added_tokens"] = added
    full["model"] = dict(meta["model"], vocab=vocab, merges=[[a, b] for a, b in merges])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(full, ensure_ascii=False, indent=1)
    final = Tokenizer.from_str(text)

    # 3. Checks: the relaid tokenizer encodes exactly like the trained one (ids mapped),
    # decodes back to the input, and keeps every added token whole.
    sample = train_text[:200000]
    want = [vocab[learnt_tok] for learnt_tok in tok.encode(sample).tokens]
    got = final.encode(sample).ids
    assert got == want, "relaid vocabulary encodes differently"
    assert final.decode(got) == sample
    for t in added:
        assert final.encode("x" + t["content"] + "y").ids[1] == t["id"], t
    (out / "tokenizer.json").write_text(text + "\n", encoding="utf-8")

    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": head[0]["content"],
        "eos_token": head[1]["content"],
        "pad_token": head[2]["content"],
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(cfg, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    n_tok = len(final.encode(train_text).ids)
    print(f"vocab {args.vocab}: {n_head} specials, {n_bytes} bytes, {n_merges} merges, "
          f"{n_roles} role/tool tokens at {args.vocab - n_roles}..{args.vocab - 1}; "
          f"train split {len(train_text)} chars -> {n_tok} tokens "
          f"({len(train_text) / n_tok:.2f} chars/token)")


if __name__ == "__main__":
    main()

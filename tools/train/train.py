#!/usr/bin/env python3
"""Train spark-tiny, evaluate it the way the quality gate will, and export it.

One run does everything, so that one device call suffices:
  1. tokenize the splits made by make_corpus.py with the tokenizer made by
     train_tokenizer.py;
  2. for each trial (dropout : epochs), train a fresh SparkModel (model.py) on random
     CTX-token windows of the TRAINING split: AdamW, linear warm-up then cosine decay,
     bf16 autocast, optionally torch.compile; the number of steps is the smaller of
     `epochs` passes over the training tokens and what fits in --trial-seconds at the
     measured step time; the validation split is scored every --eval-every steps and
     the best-scoring weights are kept (val only picks the checkpoint; test is never
     looked at during training);
  3. take the trial with the best validation loss, round its weights to bf16 (the
     exported checkpoint), upcast to fp32, and with TF32 off compute: held-out (test)
     perplexity under model.PPL_PROTOCOL at CTX (all windows, plus per-window sums so a
     prefix subset can be checked cheaply), the same at other window lengths (does the
     model hold up past its training context?), greedy continuations of three fixed
     prompts, and one nucleus-sampled text;
  4. write OUT/{model.safetensors (bf16), config.json, generation_config.json,
     reference.json, samples.txt}.

Usage (the device run, see models/spark-tiny/MODEL_CARD.md for the exact command):
  python3 tools/train/train.py --out $OUT --trials 0.3:15,0.4:20,0.4:30,0.5:30 \
      --trial-seconds 90 --eval-every 25 --compile
  python3 tools/train/train.py --out /tmp/smoke --shape smoke --trials 0.0:0.05 --device cpu
"""
import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model as M  # noqa: E402

PROMPTS = ["In the beginning", "And the LORD said unto Moses,", "Blessed are the"]
GREEDY_NEW = 64
SAMPLE_PROMPT = "And it came to pass"
SAMPLE_NEW = 200
SUBSET_WINDOWS = 8          # prefix subset stored for fast CPU checks
CTX_STUDY = [256, 512, 1024, 2048]


def shape_config(name, vocab):
    if name == "base":
        return M.SparkConfig(vocab_size=vocab)
    if name == "smoke":  # a few layers of the same pattern, for a CPU test of the pipeline
        return M.SparkConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=4, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=48, sliding_window=16,
                             layer_types=[M.SLIDING] * 3 + [M.FULL])
    raise SystemExit(f"unknown shape {name}")


def log(*a):
    print(*a, flush=True)


def lr_at(step, total, warmup, peak, floor_frac):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def batch_of(tokens, B, T, gen, device):
    """B random windows (x, y) of T tokens from a 1-D token tensor on `device`."""
    starts = torch.randint(0, tokens.numel() - T - 1, (B,), generator=gen, device="cpu")
    idx = starts.to(device)[:, None] + torch.arange(T + 1, device=device)[None, :]
    w = tokens[idx]
    return w[:, :-1], w[:, 1:]


@torch.no_grad()
def val_loss(model, ids, ctx, device):
    model.eval()
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                        enabled=device.type == "cuda"):
        w = M.window_nll(model, ids, ctx, device, batch=32)
    model.train()
    return M.ppl_of(w)[1]


def train_trial(args, cfg, dropout, epochs, tok, val, device, seed):
    model = M.SparkModel(cfg, dropout=dropout)
    model.init_weights(seed)
    model.to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=device.type == "cuda")
    fwd = model
    if args.compile:
        fwd = torch.compile(model)
    gen = torch.Generator().manual_seed(seed + 1)
    B, T = args.batch, args.ctx
    tok_per_step = B * T
    total = max(args.warmup + 1, int(epochs * tok.numel() / tok_per_step))
    if args.max_steps:
        total = min(total, args.max_steps)
    curve, best = [], (float("inf"), None, -1)
    t_start = time.time()
    t_measure = None
    step, run_loss, run_n = 0, 0.0, 0
    while step < total:
        lr = lr_at(step, total, args.warmup, args.lr, args.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch_of(tok, B, T, gen, device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                            enabled=device.type == "cuda"):
            logits = fwd(x)
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run_loss += float(loss.detach())   # a sync per step; negligible at these sizes
        run_n += 1
        step += 1
        if step == 10:
            t_measure = time.time()
        if step == 30:
            per = (time.time() - t_measure) / 20
            log(f"  {per * 1000:.1f} ms/step = {tok_per_step / per / 1e6:.2f} M tok/s after warm-up"
                + (f", peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
                   if device.type == "cuda" else ""))
        if step == 30 and args.trial_seconds:
            # Fit the schedule to the time left, now that a step's cost is known (the
            # first 10 steps hold compilation and are not counted).
            fit = int((args.trial_seconds - (time.time() - t_start)) / per) + step
            if fit < total:
                log(f"  time budget: {per * 1000:.1f} ms/step, steps {total} -> {fit}")
                total = max(fit, step + 1)
        if step % args.eval_every == 0 or step == total:
            vl = val_loss(model, val, T, device)
            el = time.time() - t_start
            tr = run_loss / run_n
            curve.append({"step": step, "train_loss": round(tr, 4), "val_loss": round(vl, 4),
                          "lr": lr, "seconds": round(el, 1)})
            log(f"  step {step:5d}/{total} lr {lr:.2e} train {tr:.4f} val {vl:.4f} "
                f"(ppl {math.exp(vl):.2f}) {step * tok_per_step / el / 1e6:.2f} M tok/s "
                f"{el:.0f} s")
            run_loss, run_n = 0.0, 0
            if vl < best[0]:
                best = (vl, copy.deepcopy(model.state_dict()), step)
    elapsed = time.time() - t_start
    return {"dropout": dropout, "epochs_asked": epochs, "steps": total,
            "tokens": total * tok_per_step, "epochs": total * tok_per_step / tok.numel(),
            "seconds": round(elapsed, 1), "tokens_per_s": round(total * tok_per_step / elapsed),
            "best_val_loss": best[0], "best_step": best[2], "curve": curve,
            "params": n_params}, best[1]


def main():
    ap = argparse.ArgumentParser()
    here = Path(__file__).resolve().parent
    ap.add_argument("--data", default=str(here / "data"))
    ap.add_argument("--tokenizer", default=str(here / "data"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="base")
    ap.add_argument("--trials", default="0.1:40", help="comma list of dropout:epochs")
    ap.add_argument("--trial-seconds", type=float, default=0)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-batch", type=int, default=16)
    args = ap.parse_args()
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log(f"torch {torch.__version__} device {device}"
        + (f" ({torch.cuda.get_device_name(0)})" if device.type == "cuda" else ""))
    log("args", vars(args))

    tk = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
    vocab = tk.get_vocab_size(with_added_tokens=True)
    splits = {}
    for name in ("train", "val", "test"):
        text = (Path(args.data) / f"{name}.txt").read_text(encoding="utf-8")
        splits[name] = torch.tensor(tk.encode(text).ids, dtype=torch.long)
        log(f"{name}: {len(text)} chars, {splits[name].numel()} tokens")
    train_tok = splits["train"].to(device)
    val_tok = splits["val"]
    cfg = shape_config(args.shape, vocab)
    cfg.max_position_embeddings = max(CTX_STUDY)
    log("config", json.dumps(cfg.to_hf()))

    # ---- training trials
    trials, best_state, best_trial = [], None, None
    for i, spec in enumerate(args.trials.split(",")):
        d, e = spec.split(":")
        log(f"trial {i}: dropout {d}, up to {e} epochs")
        torch.manual_seed(args.seed + i)
        info, state = train_trial(args, cfg, float(d), float(e), train_tok, val_tok,
                                  device, args.seed + 100 * i)
        log(f"trial {i}: best val {info['best_val_loss']:.4f} at step {info['best_step']} "
            f"of {info['steps']} ({info['epochs']:.1f} epochs, {info['seconds']} s, "
            f"{info['tokens_per_s'] / 1e6:.2f} M tok/s)")
        trials.append(info)
        if best_trial is None or info["best_val_loss"] < best_trial["best_val_loss"]:
            best_trial, best_state = info, state
        del state
    train_seconds = time.time() - t0

    # ---- the exported checkpoint: bf16-rounded weights, evaluated in fp32, no TF32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    model = M.SparkModel(cfg)
    model.load_state_dict(best_state)
    M.save_hf(model, out)
    ref_model = M.load_hf(out, dtype=torch.float32, device=device)
    n_params = sum(p.numel() for p in ref_model.parameters())

    test = splits["test"]
    windows = M.window_nll(ref_model, test, args.ctx, device, batch=args.eval_batch)
    ppl, mean_nll, count = M.ppl_of(windows)
    sub = windows[:SUBSET_WINDOWS]
    sub_ppl, sub_nll, sub_count = M.ppl_of(sub)
    log(f"held-out ppl (ctx {args.ctx}, {len(windows)} windows, {count} tokens): {ppl:.4f}")
    log(f"held-out ppl, first {SUBSET_WINDOWS} windows: {sub_ppl:.6f}")
    val_ppl = M.ppl_of(M.window_nll(ref_model, val_tok, args.ctx, device, batch=args.eval_batch))[0]
    study = {}
    for c in CTX_STUDY:
        p = M.ppl_of(M.window_nll(ref_model, test, c, device, batch=max(1, args.eval_batch * 512 // c)))
        study[str(c)] = {"ppl": round(p[0], 4), "scored": p[2]}
        log(f"  ctx {c}: held-out ppl {p[0]:.4f}")

    # Train-split loss in the same protocol (first 64 windows) shows the generalisation gap.
    train_ppl = M.ppl_of(M.window_nll(ref_model, splits["train"], args.ctx, device,
                                      max_windows=64, batch=args.eval_batch))[0]

    cases = []
    for p in PROMPTS:
        ids = tk.encode(p).ids
        new, margins = M.greedy(ref_model, ids, GREEDY_NEW, device)
        text = tk.decode(ids + new)
        cases.append({"prompt": p, "prompt_ids": ids, "greedy_ids": new,
                      "greedy_text": text, "min_margin": round(min(margins), 5),
                      "margins": [round(m, 5) for m in margins]})
        log(f"greedy {p!r} -> {text!r} (smallest top1-top2 margin {min(margins):.4f})")
    s_ids = tk.encode(SAMPLE_PROMPT).ids
    s_new = M.sample(ref_model, s_ids, SAMPLE_NEW, device, seed=args.seed)
    s_text = tk.decode(s_ids + s_new)

    # Logits of the first held-out window's first positions: for debugging a runtime.
    with torch.no_grad():
        lg = ref_model(test[None, :16].to(device))[0].float().cpu()
    probe = {"ids": test[:16].tolist(),
             "argmax": lg.argmax(-1).tolist(),
             "max_logit": [round(float(v), 5) for v in lg.max(-1).values],
             "logsumexp": [round(float(v), 5) for v in torch.logsumexp(lg, -1)]}

    ref = {
        "model": "spark-tiny",
        "params": n_params,
        "config": cfg.to_hf(),
        "heldout": {
            "file": "heldout.txt",
            "protocol": M.PPL_PROTOCOL.replace("CTX", str(args.ctx)),
            "ctx": args.ctx, "stride": args.ctx,
            "tokens": test.numel(), "scored": count,
            "ppl": ppl, "mean_nll": mean_nll,
            "subset": {"windows": len(sub), "scored": sub_count, "ppl": sub_ppl,
                       "mean_nll": sub_nll},
            "windows": [{"start": s, "scored": n, "nll_sum": round(v, 6)}
                        for s, n, v in windows],
            "ctx_study": study,
        },
        "val_ppl": val_ppl, "train_ppl_first64": train_ppl,
        "greedy": cases,
        "sample": {"prompt": SAMPLE_PROMPT, "temperature": 1.0, "top_p": 0.95,
                   "seed": args.seed, "torch_generator": "cpu multinomial", "text": s_text},
        "logit_probe": probe,
        "training": {"trials": trials, "chosen_trial": trials.index(best_trial),
                     "batch": args.batch, "ctx": args.ctx, "lr": args.lr,
                     "min_lr_frac": args.min_lr_frac, "warmup": args.warmup,
                     "weight_decay": args.wd, "compile": args.compile,
                     "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                     "torch": torch.__version__, "train_tokens": splits["train"].numel(),
                     "val_tokens": val_tok.numel(),
                     "train_seconds": round(train_seconds, 1)},
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")
    gen_cfg = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "do_sample": True,
               "temperature": 1.0, "top_p": 0.95, "top_k": 0}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    with open(out / "samples.txt", "w", encoding="utf-8") as f:
        for c in cases:
            f.write(f"=== greedy, {GREEDY_NEW} tokens: {c['prompt']!r}\n{c['greedy_text']}\n\n")
        f.write(f"=== sampled (T=1.0, top_p=0.95, seed {args.seed}), {SAMPLE_NEW} tokens: "
                f"{SAMPLE_PROMPT!r}\n{s_text}\n")
    log(f"sample: {s_text!r}")
    log(f"done in {time.time() - t0:.0f} s; params {n_params}; held-out ppl {ppl:.4f}")


if __name__ == "__main__":
    main()

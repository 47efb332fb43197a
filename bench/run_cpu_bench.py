#!/usr/bin/env python3
"""CPU benchmark on a 4B-shaped synthetic Spark model (SPEC section 1 dims).

    python3 bench/run_cpu_bench.py [--spark build/spark] [--dir /tmp/spark-bench-4b]
        [--types bf16,q8_0,q4_k_m] [-p 512] [-n 128] [-t N] [--prev BIN] [--prev-types T]
        [--max-load L] [--retries N] [--keep]
        [--record bench/RESULTS.md]

1. Writes a bf16 GGUF with seeded random weights of the real 4B shape
   (hidden 2560, ff 10240, 36 layers, 16/4 heads, head_dim 256, vocab 131072,
   8.2 GB), one tensor at a time through gguf-py's streaming writer.
2. Makes the other types with `spark quantize` (the C quantizer).
3. Runs `spark bench --json` on each (pp and tg, with the bandwidth and FMA
   probes), and with --prev BIN also a previous build right after it on the
   types named by --prev-types (default bf16; --prev-p / --prev-n, default
   32 / 8 for a slow old build). --max-load waits for a quiet minute before
   each run, --retries re-runs one another job disturbed.
4. With --llama-bench BIN (a llama.cpp `llama-bench` built elsewhere; none
   is packaged for this Debian release), runs it right after each row on the
   same weights: a copy of the file with one key added,
   tokenizer.ggml.model = "none" (llama.cpp refuses a file without a
   tokenizer key; llama-bench feeds token ids, so no vocabulary is needed),
   every tensor byte identical (checked). `-t` threads, `-p`/`-n` the same
   tests, `--llama-args` extra flags (e.g. "-lm none": read, not mapped).
5. Prints a markdown section and, with --record, appends it to RESULTS.md.
Files are deleted at the end unless --keep.
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

SHAPE = dict(hidden=2560, ff=10240, layers=36, heads=16, kv_heads=4, head_dim=256, vocab=131072, window=512,
             pattern="SSSF", max_ctx=1048576, seed=0)


def bf16_bits(a):
    """float32 -> bf16 bit patterns, round to nearest even (no NaNs here)."""
    u = a.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def make_bf16_gguf(path):
    """Stream a 4B-shaped bf16 GGUF to `path`; returns seconds taken."""
    import gguf
    import mkmodel
    import sparkgguf
    t0 = time.time()
    cfg = mkmodel.build_config(dtype="bf16", **SHAPE)
    E, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, Hk, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rng = np.random.default_rng(SHAPE["seed"])
    specs = [("token_embd.weight", (V, E), E ** -0.25)]
    for i in range(cfg["num_hidden_layers"]):
        b = f"blk.{i}."
        specs += [(b + "attn_norm.weight", (E,), None), (b + "attn_qkv.weight", ((H + 2 * Hk) * D, E), E ** -0.5),
                  (b + "attn_gate.weight", (H, E), E ** -0.5), (b + "attn_output.weight", (E, H * D), (H * D) ** -0.5),
                  (b + "ffn_norm.weight", (E,), None), (b + "ffn_gate.weight", (F, E), E ** -0.5),
                  (b + "ffn_up.weight", (F, E), E ** -0.5), (b + "ffn_down.weight", (E, F), F ** -0.5)]
    specs.append(("output_norm.weight", (E,), None))
    w = gguf.GGUFWriter(str(path), "spark2_5")
    w.add_name("spark-4b-synthetic")
    w.add_file_type(32)
    sparkgguf._add_hparams(w, cfg)
    sparkgguf._add_special_ids(w, cfg)
    for name, shape, _ in specs:
        if len(shape) == 1:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            w.add_tensor_info(name, shape, np.dtype(np.uint16), 2 * shape[0] * shape[1],
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, scale in specs:
        if scale is None:
            w.write_tensor_data(1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32))
            continue
        out = np.empty(shape, dtype=np.uint16)
        step = max(1, (64 << 20) // (4 * shape[1]))
        for r in range(0, shape[0], step):  # 64 MB of float32 at a time
            block = rng.standard_normal((min(step, shape[0] - r), shape[1]), dtype=np.float32)
            block *= np.float32(scale)
            out[r:r + step] = bf16_bits(block)
        w.write_tensor_data(out)
    w.close()
    return time.time() - t0


def run(cmd, **kw):
    print("+", " ".join(map(str, cmd)), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


MAX_LOAD = None  # --max-load: wait for a quieter minute before each run


def wait_for_quiet(limit_s=900):
    """Sleep until the 1-minute load average is below MAX_LOAD (or limit_s passed)."""
    if MAX_LOAD is None:
        return
    t0 = time.time()
    while os.getloadavg()[0] >= MAX_LOAD and time.time() - t0 < limit_s:
        time.sleep(10)


RETRIES = 0  # --retries: re-run a row that something else disturbed


def disturbed(r):
    """Another job took a share of the machine during the run: the bandwidth
    probe after it read much less than before, or the load rose well past
    what the run itself adds (about its thread count over a minute)."""
    after, before = r.get("bandwidth_after_gb_s"), r.get("bandwidth_before_gb_s")
    if after and before and after < 0.85 * before:
        return True
    return MAX_LOAD is not None and r["load_after"] > MAX_LOAD + 0.8


def bench(spark, model, p, n, threads, reps=1, extra=()):
    cmd = [spark, "bench", model, "-p", p, "-n", n, "-r", reps, "--json", *extra]
    if threads:
        cmd += ["-t", threads]
    for attempt in range(RETRIES + 1):
        wait_for_quiet()
        load0 = os.getloadavg()[0]
        out = json.loads(run(cmd, capture_output=True, text=True).stdout)
        out["load_before"], out["load_after"], out["attempts"] = load0, os.getloadavg()[0], attempt + 1
        if not disturbed(out):
            break
        print(f"disturbed run (load {load0:.2f} -> {out['load_after']:.2f}), retrying", file=sys.stderr, flush=True)
    return out


def llama_copy(path, out):
    """`path` with tokenizer.ggml.model = "none" added, at `out` (made once)."""
    import gguf
    if out.exists():
        return out
    r = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(out) + ".part", r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    w.add_string("tokenizer.ggml.model", "none")
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, int(t.n_bytes), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data)
    w.close()
    r2 = gguf.GGUFReader(str(out) + ".part")
    src = {t.name: t for t in r.tensors}
    for t in r2.tensors:  # the same tensors, byte for byte
        a = np.asarray(t.data).view(np.uint8).ravel()
        assert np.array_equal(a, np.asarray(src[t.name].data).view(np.uint8).ravel()), t.name
    os.rename(str(out) + ".part", out)
    return out


def llama_bench(binary, model, p, n, threads, extra=()):
    """llama-bench's pp and tg t/s (mean over its repetitions) as a dict."""
    cmd = [binary, "-m", model, "-p", p, "-n", n, "-r", 2, "-o", "json", *extra]
    if threads:
        cmd += ["-t", threads]
    wait_for_quiet()
    load0 = os.getloadavg()[0]
    proc = run(cmd, capture_output=True, text=True)
    out = {"load_before": load0, "load_after": os.getloadavg()[0], "args": " ".join(map(str, cmd[1:]))}
    for test in json.loads(proc.stdout):
        key = "pp" if test["n_gen"] == 0 else "tg"
        out[key + "_tok_s"], out[key + "_sd"] = test["avg_ts"], test["stddev_ts"]
        out["threads"], out["build"] = test.get("n_threads"), test.get("build_commit", "?")
    return out


def llama_row(label, r, ours):
    """A row for llama.cpp next to our row `ours` (the same file and probe):
    decode GB/s = our bytes per token x its t/s; prefill GFLOP/s likewise."""
    bpt = ours["tg_gb_s"] / ours["tg_tok_s"] if ours["tg_tok_s"] else 0
    fpt = ours["pp_gflop_s"] / ours["pp_tok_s"] if ours.get("pp_tok_s") else 0
    pp, tg = r.get("pp_tok_s", 0), r.get("tg_tok_s", 0)
    gb = bpt * tg
    return (f"| {label} | {ours['weights_bytes'] / 2**30:.2f} GiB | {r.get('threads')} | "
            f"pp{ours['pp_tokens']}: {pp:.2f} ± {r.get('pp_sd', 0):.2f} | {fpt * pp:.1f} "
            f"({100 * fpt * pp / ours['fma_peak_gflop_s']:.0f}% of {ours['fma_peak_gflop_s']:.0f}) | "
            f"tg{ours['tg_tokens']}: {tg:.3f} ± {r.get('tg_sd', 0):.3f} | {gb:.2f} | {ours['bandwidth_gb_s']:.2f} | "
            f"**{100 * gb / ours['bandwidth_gb_s']:.1f}%** | llama-bench | "
            f"{r['load_before']:.2f} / {r['load_after']:.2f} |")


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return "?"


def row(label, r):
    pp = f"{r['pp_tok_s']:.2f}" if r["pp_tokens"] else "-"
    tg = f"{r['tg_tok_s']:.3f}" if r["tg_tokens"] else "-"
    return (f"| {label} | {r['weights_bytes'] / 2**30:.2f} GiB | {r['threads']} | pp{r['pp_tokens']}: {pp} | "
            f"{r['pp_gflop_s']:.1f} ({r['pp_peak_pct']:.0f}% of {r['fma_peak_gflop_s']:.0f}) | "
            f"tg{r['tg_tokens']}: {tg} | {r['tg_gb_s']:.2f} | {r['bandwidth_gb_s']:.2f} | "
            f"**{r['floor_pct']:.1f}%** | {r.get('load_mode', 'mmap')} | {r['load_before']:.2f} / {r['load_after']:.2f} |")


def section(results, prev, args, gen_s, quant_s, llama=None):
    llama = llama or {}
    cpu = results[0][1]["cpu"] if results else "?"
    lines = [f"## CPU backend, 4B-shaped synthetic model ({datetime.date.today().isoformat()})", "",
             f"`python3 bench/run_cpu_bench.py` at commit {git_commit()}. CPU: {cpu}, "
             f"{os.cpu_count()} cores, ISA level {results[0][1]['isa'] if results else '?'}. "
             f"Model: SPEC §1 dims (36 layers, hidden 2560, ff 10240, vocab 131072), seeded random "
             f"weights; bf16 written by the script ({gen_s:.0f} s), the others by `spark quantize` "
             f"({', '.join(f'{k} {v:.0f} s' for k, v in quant_s.items())}).", "",
             "Decode GB/s counts every weight byte once per token plus the KV rows read; the floor is the "
             "probe's streaming-read bandwidth with the same threads; % of floor = achieved / probe. "
             "Prefill GFLOP/s counts 2 per multiply-add in the matrices plus attention, against the FMA probe. "
             "Load = 1-minute load average before / after (the machine is shared with other jobs).", "",
             "| model | weights | threads | prefill t/s | prefill GFLOP/s (% of peak) | decode t/s | decode GB/s | "
             "probe GB/s | % of floor | weights held | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in results:
        lines.append(row(label, r))
        if label in prev:
            lines.append(row(f"{label}, previous build", prev[label]))
        if label in llama:
            lines.append(llama_row(f"{label}, llama.cpp", llama[label], r))
    if llama:
        any_r = next(iter(llama.values()))
        lines += ["", f"llama.cpp rows: `llama-bench {any_r['args']}` (build {any_r.get('build', '?')}) on a copy of "
                      "the same file with `tokenizer.ggml.model = \"none\"` added (tensor bytes identical); its "
                      "decode GB/s and prefill GFLOP/s use our byte and flop counts per token for the same "
                      "file, and our row's probes.", ""]
    else:
        lines += ["", "llama.cpp: none is packaged here (`apt-cache policy llama.cpp`: no candidate on Debian "
                      "12); pass --llama-bench BIN to put one next to these rows.", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spark", default=str(ROOT / "build" / "spark"))
    ap.add_argument("--dir", default="/tmp/spark-bench-4b")
    ap.add_argument("--types", default="bf16,q8_0,q4_k_m")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=0)
    ap.add_argument("--prev", help="a previous spark binary, benched on the same files right after each row")
    ap.add_argument("--prev-types", default="bf16", help="the types to bench --prev on (default bf16)")
    ap.add_argument("--prev-p", type=int, default=32)
    ap.add_argument("--prev-n", type=int, default=8)
    ap.add_argument("--max-load", type=float, help="before each run, wait (up to 15 min) for a 1-minute load "
                                                      "average below this")
    ap.add_argument("--retries", type=int, default=0, help="re-run a row disturbed by other jobs up to this "
                                                            "many times")
    ap.add_argument("--bench-args", default="", help="extra `spark bench` arguments for the current build "
                                                       "(e.g. --mmap)")
    ap.add_argument("--llama-bench", help="a llama.cpp llama-bench binary, run on the same weights after each row")
    ap.add_argument("--llama-types", default="bf16,q8_0,q4_k_m")
    ap.add_argument("--llama-args", default="", help="extra llama-bench arguments (e.g. '-lm none')")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--record", help="append the section to this markdown file")
    a = ap.parse_args()
    global MAX_LOAD, RETRIES
    MAX_LOAD, RETRIES = a.max_load, a.retries
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    src = d / "spark-4b-bf16.gguf"
    gen_s = 0.0
    if not src.exists():
        gen_s = make_bf16_gguf(src)
    quant_s, results, prev, llama = {}, [], {}, {}
    try:
        for t in a.types.split(","):
            path = src if t == "bf16" else d / f"spark-4b-{t}.gguf"
            if not path.exists():
                t0 = time.time()
                flag = ["--recipe", "q4_k_m"] if t == "q4_k_m" else ["--type", t]
                run([a.spark, "quantize", src, path, *flag, "-q"] + (["-t", a.t] if a.t else []))
                quant_s[t] = time.time() - t0
            results.append((t, bench(a.spark, path, a.p, a.n, a.t, extra=a.bench_args.split())))
            print(json.dumps(results[-1][1]), flush=True)
            if a.prev and t in a.prev_types.split(","):
                prev[t] = bench(a.prev, path, a.prev_p, a.prev_n, a.t)
                print(json.dumps(prev[t]), flush=True)
            if a.llama_bench and t in a.llama_types.split(","):
                (d / "llama").mkdir(exist_ok=True)
                copy = llama_copy(path, d / "llama" / path.name)
                llama[t] = llama_bench(a.llama_bench, copy, a.p, a.n, a.t, extra=a.llama_args.split())
                print(json.dumps(llama[t]), flush=True)
        text = section(results, prev, a, gen_s, quant_s, llama)
        print(text)
        if a.record:
            with open(a.record, "a", encoding="utf-8") as f:
                f.write("\n" + text)
    finally:
        if not a.keep:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()

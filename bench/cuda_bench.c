/*
 * cuda_bench.c — batch-1 decode and prefill timing of a spark session on
 * the CUDA backend (or the CPU with --cpu), through the public API only.
 *
 *   cuda_bench MODEL [--ctx N] [--prefill P] [--decode D] [--cpu] [--card-tbs B]
 *   cuda_bench MODEL --sweep N1,N2,... [--cpu]
 *
 * With --sweep: only prompts of each of those lengths, each prefilled three
 * times from an empty context, the fastest printed (one "sweep" line each);
 * what SPARK_CUDA_GEMV_TOKENS (GEMV or GEMM for a short prompt) is tuned by.
 * Prefills P pseudo-random ids three times (the first printed apart: one-time
 * costs; the faster of the other two is the figure; last-row logits), then decodes D
 * tokens one at a time with their logits copied back to the host (timed: the
 * real generation step, sampling excepted). Prints tokens/s, and against the
 * physical limit the bytes each decode step must read: every weight once,
 * plus the KV rows attention reads at the reached context (fp32 cache).
 * Floor = those bytes / 4.24 TB/s (the H200's measured copy bandwidth, issue 6);
 * with --card-tbs B (the card's own copy probe, TB/s) a last "card:" line
 * gives the decode and greedy rows against those bytes / B as well.
 * Then D tokens of greedy generation through spark_generate (no tokenizer:
 * ids only; EOS ignored), what `spark run --temp 0` does per token: with the
 * backend's device pick unless SPARK_PICK=0 (then logits copied back and
 * the host sampler's argmax); and D more sampled with the recommended
 * settings (temperature 1, top-p 0.95, seed 1) and D at temperature 0.5:
 * from the backend's candidates unless SPARK_PICK=0.
 * The first eval of each kind is a warm-up and is not timed.
 */
#include "spark.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const double FLOOR_BPS = 4.24e12;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A positive number, the whole argument, or the usage. */
static double number_arg(const char *flag, const char *text)
{
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !(v > 0)) {
        fprintf(stderr, "cuda_bench: %s wants a positive number, got '%s'\n", flag, text);
        exit(2);
    }
    return v;
}

static void die(const char *what)
{
    fprintf(stderr, "cuda_bench: %s: %s\n", what, spark_last_error());
    exit(1);
}

/* Bytes of K and V that attention reads for one query at position pos. */
static double kv_bytes(const spark_model_config *c, int64_t pos)
{
    double row = 2.0 * c->n_head_kv * c->head_dim * sizeof(float), total = 0;
    for (int i = 0; i < c->n_layer; i++) {
        int64_t keys = pos + 1;
        if (c->layer_kind[i] == SPARK_LAYER_SLIDING && keys > c->sliding_window) keys = c->sliding_window;
        total += (double)keys * row;
    }
    return total;
}

/* The model at `path` and a session of n_ctx tokens on it, on the GPU or
 * the CPU; exits with the library's message on failure. */
static spark_session *open_session(const char *path, long n_ctx, int cpu, spark_model **model)
{
    if (spark_model_load(path, model) != SPARK_OK) die("load");
    spark_session_options o = spark_session_default_options();
    o.n_ctx = (int32_t)n_ctx;
    o.backend = cpu ? SPARK_BACKEND_CPU : SPARK_BACKEND_CUDA;
    spark_session *s;
    if (spark_session_create(*model, &o, &s) != SPARK_OK) die("session");
    return s;
}

/* One prefill of the first n ids from an empty context, in seconds. */
static double prefill_seconds(spark_session *s, const int32_t *ids, long n, float *logits)
{
    spark_session_reset(s);
    double a = now();
    if (spark_session_eval(s, ids, (int32_t)n, logits, 0) != SPARK_OK) die("prefill");
    return now() - a;
}

/* --sweep: the fastest of three prefills of each listed length. */
static int run_sweep(const char *path, const char *list, int cpu)
{
    long lens[64];
    int count = 0;
    long longest = 0;
    for (const char *p = list; *p && count < 64;) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 1 || (*end && *end != ',')) {
            fprintf(stderr, "cuda_bench: --sweep wants lengths like 8,16,32, got '%s'\n", list);
            return 2;
        }
        lens[count++] = n;
        if (n > longest) longest = n;
        p = *end ? end + 1 : end;
    }
    if (!path || count == 0) {
        fprintf(stderr, "usage: cuda_bench MODEL --sweep N1,N2,... [--cpu]\n");
        return 2;
    }
    spark_model *model;
    spark_session *s = open_session(path, longest + 32, cpu, &model);
    const spark_model_config *c = spark_model_get_config(model);
    int32_t *ids = malloc((size_t)(longest + 16) * sizeof(int32_t));
    float *logits = malloc((size_t)c->n_vocab * sizeof(float));
    for (long i = 0; i < longest + 16; i++) ids[i] = 3 + (int32_t)((i * 7919) % (c->n_vocab - 3));
    if (spark_session_eval(s, ids, 16, logits, 0) != SPARK_OK) die("warm-up");
    const char *gt = getenv("SPARK_CUDA_GEMV_TOKENS");
    for (int k = 0; k < count; k++) {
        double best = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t = prefill_seconds(s, ids, lens[k], logits);
            if (t < best) best = t;
        }
        printf("sweep %ld tokens [SPARK_CUDA_GEMV_TOKENS=%s]: %.2f ms, %.0f tok/s\n", lens[k], gt ? gt : "default",
               best * 1e3, lens[k] / best);
    }
    free(ids);
    free(logits);
    spark_session_free(s);
    spark_model_free(model);
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    long ctx = 4096, prefill = 512, decode = 128;
    int cpu = 0;
    double card_bps = 0; /* --card-tbs: this card's probe, bytes/s */
    const char *sweep = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atol(argv[++i]);
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) prefill = atol(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) decode = atol(argv[++i]);
        else if (!strcmp(argv[i], "--cpu")) cpu = 1;
        else if (!strcmp(argv[i], "--card-tbs") && i + 1 < argc) card_bps = number_arg("--card-tbs", argv[i + 1]) * 1e12, i++;
        else if (!strcmp(argv[i], "--sweep") && i + 1 < argc) sweep = argv[++i];
        else if (!path) path = argv[i];
        else {
            fprintf(stderr, "usage: cuda_bench MODEL [--ctx N] [--prefill P] [--decode D] [--cpu] [--card-tbs B]\n");
            return 2;
        }
    }
    if (sweep) return run_sweep(path, sweep, cpu);
    if (!path || prefill < 1 || decode < 1 || prefill + 5 * decode + 16 > ctx || card_bps < 0) {
        fprintf(stderr, "usage: cuda_bench MODEL [--ctx N] [--prefill P] [--decode D] [--cpu] [--card-tbs B] "
                        "(P + 5 D + 16 <= N)\n");
        return 2;
    }
    double t0 = now();
    spark_model *model;
    spark_session *s = open_session(path, ctx, cpu, &model);
    const spark_model_config *c = spark_model_get_config(model);
    double t_setup = now() - t0;

    int32_t *ids = malloc((size_t)(prefill + 2 * decode + 16) * sizeof(int32_t));
    float *logits = malloc((size_t)c->n_vocab * sizeof(float));
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < prefill + 2 * decode + 16; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = 3 + (int32_t)((rng >> 33) % (uint64_t)(c->n_vocab - 3));
    }
    /* warm-up: a GEMM-sized chunk and a few single tokens */
    if (spark_session_eval(s, ids, 16, logits, 0) != SPARK_OK) die("warm-up");
    for (int i = 0; i < 4; i++)
        if (spark_session_eval(s, ids + 16 + i, 1, logits, 0) != SPARK_OK) die("warm-up");
    spark_session_reset(s);

    /* the prompt's first prefill pays one-time costs (the library's plans
     * and workspaces for its shapes, kernels loaded on first use); it is
     * printed apart, and the figure is the faster of two more, as peers'
     * benchmarks time a warmed-up run */
    double t_cold = prefill_seconds(s, ids, prefill, logits);
    double t_pre = prefill_seconds(s, ids, prefill, logits);
    double t_again = prefill_seconds(s, ids, prefill, logits);
    if (t_again < t_pre) t_pre = t_again;

    double a = now();
    for (long i = 0; i < decode; i++)
        if (spark_session_eval(s, ids + prefill + i, 1, logits, 0) != SPARK_OK) die("decode");
    double t_dec = now() - a;

    /* the same steps without logits (the last one excepted, which waits for
     * all): no head, no copy, no wait per token, the host's recording
     * overlapped: what the layers alone take on the device */
    a = now();
    for (long i = 0; i < decode; i++)
        if (spark_session_eval(s, ids + prefill + decode + i, 1, i + 1 == decode ? logits : NULL, 0) != SPARK_OK)
            die("decode without logits");
    double t_dev = now() - a;

    /* greedy generation of `decode` tokens after one more prompt token */
    spark_sampler_params sp = spark_sampler_default_params();
    sp.temperature = 0;
    spark_sampler *greedy;
    if (spark_sampler_create(&sp, c->n_vocab, &greedy) != SPARK_OK) die("sampler");
    spark_generate_params gp = {.max_tokens = (int32_t)decode, .ignore_eos = 1};
    spark_generate_result gr;
    if (spark_generate(s, NULL, greedy, ids + prefill + 2 * decode, 1, &gp, &gr) != SPARK_OK) die("generate");
    spark_sampler_free(greedy);
    double t_gen = gr.generate_seconds / (double)gr.n_generated;
    spark_sampler_params rp = spark_sampler_default_params();
    rp.temperature = 1.0f;
    rp.top_p = 0.95f;
    rp.seed = 1;
    spark_sampler *recommended;
    if (spark_sampler_create(&rp, c->n_vocab, &recommended) != SPARK_OK) die("sampler");
    spark_generate_result sr;
    if (spark_generate(s, NULL, recommended, ids + prefill + 2 * decode + 1, 1, &gp, &sr) != SPARK_OK) die("generate");
    spark_sampler_free(recommended);
    double t_smp = sr.generate_seconds / (double)sr.n_generated;
    /* the same at temperature 0.5: a synthetic model's logits are flat (the
     * top-p head holds most of the vocabulary, more than the candidates
     * take), a trained model's are not; halving the temperature sharpens
     * them toward the latter */
    rp.temperature = 0.5f;
    if (spark_sampler_create(&rp, c->n_vocab, &recommended) != SPARK_OK) die("sampler");
    spark_generate_result hr;
    if (spark_generate(s, NULL, recommended, ids + prefill + 2 * decode + 2, 1, &gp, &hr) != SPARK_OK) die("generate");
    spark_sampler_free(recommended);
    double t_sharp = hr.generate_seconds / (double)hr.n_generated;
    const char *pk = getenv("SPARK_PICK");
    int device_pick = !(pk && !strcmp(pk, "0"));

    double wbytes = (double)spark_model_weight_bytes(model);
    double kv = 0;
    for (long i = 0; i < decode; i++) kv += kv_bytes(c, prefill + i);
    kv /= (double)decode;
    double step = t_dec / (double)decode;
    double floor_s = (wbytes + kv) / FLOOR_BPS;
    /* matrix FLOPs of the prefill: 2 per weight per token (the head on one row) */
    double params = wbytes / 2.0; /* bf16: 2 bytes a weight (indicative for other formats) */
    printf("model %s: %d layers, hidden %d, ff %d, heads %d/%d x %d, vocab %d; weights %.3f GB; setup %.2f s (%s)\n",
           path, c->n_layer, c->n_embd, c->n_ff, c->n_head, c->n_head_kv, c->head_dim, c->n_vocab, wbytes / 1e9,
           t_setup, cpu ? "cpu" : "cuda");
    printf("prefill %ld tokens: %.1f ms, %.0f tok/s, ~%.1f TFLOP/s (matrices, bf16-sized; the faster of two after "
           "the first, which took %.1f ms)\n",
           prefill, t_pre * 1e3, prefill / t_pre, 2.0 * params * prefill / t_pre / 1e12, t_cold * 1e3);
    printf("decode %ld tokens at context %ld..%ld: %.3f ms/token, %.1f tok/s; reads %.3f GB/token "
           "(weights %.3f + KV %.3f) = %.2f TB/s = %.1f%% of the 4.24 TB/s floor (floor %.3f ms, %.0f tok/s)\n",
           decode, prefill, prefill + decode, step * 1e3, 1.0 / step, (wbytes + kv) / 1e9, wbytes / 1e9, kv / 1e9,
           (wbytes + kv) / step / 1e12, 100.0 * floor_s / step, floor_s * 1e3, 1.0 / floor_s);
    printf("decode without logits (layers only) %ld tokens at context %ld..%ld: %.3f ms/token; head + copy + host "
           "round trip %.1f us/token\n",
           decode, prefill + decode, prefill + 2 * decode, t_dev / decode * 1e3, (step - t_dev / decode) * 1e6);
    printf("generate (greedy, spark_generate, %s) %d tokens from context %ld: %.3f ms/token, %.1f tok/s, "
           "%.1f%% of the floor\n",
           device_pick ? "device pick" : "SPARK_PICK=0: logits to the host sampler", gr.n_generated,
           prefill + 2 * decode + 1, t_gen * 1e3, 1.0 / t_gen, 100.0 * floor_s / t_gen);
    printf("generate (temperature 1, top-p 0.95, %s) %d tokens: %.3f ms/token, %.1f tok/s, %.1f%% of the floor\n",
           device_pick ? "backend candidates" : "SPARK_PICK=0: logits to the host sampler", sr.n_generated,
           t_smp * 1e3, 1.0 / t_smp, 100.0 * floor_s / t_smp);
    printf("generate (temperature 0.5, top-p 0.95, %s) %d tokens: %.3f ms/token, %.1f tok/s, %.1f%% of the floor\n",
           device_pick ? "backend candidates" : "SPARK_PICK=0: logits to the host sampler", hr.n_generated,
           t_sharp * 1e3, 1.0 / t_sharp, 100.0 * floor_s / t_sharp);
    if (card_bps > 0) {
        double card_s = (wbytes + kv) / card_bps;
        printf("card: against this card's %.2f TB/s (floor %.3f ms, %.0f tok/s): decode %.1f%%, greedy generation "
               "%.1f%%\n",
               card_bps / 1e12, card_s * 1e3, 1.0 / card_s, 100.0 * card_s / step, 100.0 * card_s / t_gen);
    }
    printf("RESULT prefill=%ld prefill_tok_s=%.1f decode_tok_s=%.2f ms_per_token=%.4f tb_s=%.3f pct_floor=%.1f\n", prefill,
           prefill / t_pre, 1.0 / step, step * 1e3, (wbytes + kv) / step / 1e12, 100.0 * floor_s / step);
    free(ids);
    free(logits);
    spark_session_free(s);
    spark_model_free(model);
    return 0;
}

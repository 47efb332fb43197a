/*
 * cmd_bench.c — `spark bench`: llama-bench-style throughput of one model on
 * the CPU, next to the machine's own limits.
 *
 *   pp<N>  prefill N tokens into an empty context (tokens/s), and its
 *          GFLOP/s against the measured FMA peak: prefill is compute-bound;
 *   tg<N>  decode N tokens one at a time from an empty context (tokens/s),
 *          and the bytes it streams per token against the measured memory
 *          bandwidth: decode is memory-bound, so tokens/s can at best be
 *          bandwidth / bytes-per-token (the "floor" of the time per token).
 *
 * Both probes run first, with the same thread count as the model, so the
 * percentages compare like with like. Token ids are drawn from a fixed seed.
 */
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/hook_opts.h"
#include "cli/kv_opts.h"

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/probe.h"
#include "backend/cpu/threadpool.h"
#include "backend/cuda/cuda_backend.h"
#include "engine/kv_format.h"
#include "model/model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char bench_usage[] =
    "usage: spark bench MODEL [options]\n"
    "\n"
    "Measures prefill (pp) and decode (tg) throughput, a memory-bandwidth probe and an\n"
    "FMA-peak probe (and, for bf16 weights on a CPU with AMX, a tile-unit probe), and\n"
    "prints decode GB/s as a share of the bandwidth floor and prefill GFLOP/s as a\n"
    "share of the peaks.\n"
    "\n"
    "  -p, --n-prompt N    prompt tokens for the prefill test (default 512; 0 skips it)\n"
    "  -n, --n-gen N       tokens for the decode test (default 128; 0 skips it)\n"
    "  -d, --depth N       the decode test starts at position N: N prompt tokens are evaluated\n"
    "                      first, untimed, so its tokens attend to N earlier ones (default 0)\n"
    "  -t, --threads N     CPU threads (default: physical cores)\n"
    "  -r, --reps N        repetitions of each test; mean and spread reported (default 1)\n"
    "  --probe-mb N        bandwidth probe buffer in MiB (default 1024; 2048 with --gpu)\n"
    "  --no-probe          skip both probes (their fields print as 0)\n"
    "  --no-pair           skip the paired decode test (CPU): after the decode test, tg<N> again with\n"
    "                      the bandwidth probe's loop run over the model's own resident weights before\n"
    "                      and after every token (one pass in each prefetch form, the fastest counts);\n"
    "                      each token's GB/s is set against the faster of its two neighbouring readings,\n"
    "                      and the median and spread of those shares are reported (on a machine whose\n"
    "                      bandwidth moves from second to second this compares the decode with a plain\n"
    "                      read of the same bytes at the same moment); with it, the test's own ceiling:\n"
    "                      single probe passes scored the same way (a plain read's share, below 100 %\n"
    "                      where the bandwidth moves)\n"
    "  --json              one JSON object instead of the table\n"
    "  --gpu               run on the GPU (CUDA); the probes are then the GPU's: device-to-device\n"
    "                      copy bandwidth (read + write) and a bf16 tensor-core GEMM's TFLOP/s\n"
    KV_OPTS_HELP
    "                      (the decode's bytes a token count the cache rows in that format)\n"
    "  --phases            phase timing of the decode test (embed / attention / FFN / hooks / head;\n"
    "                      on the GPU also the wait for the device and the device's time per phase)\n"
    "  instruments, to measure their cost (see spark run --help): --steer FILE [--steer-mode M\n"
    "                      --steer-strength A --steer-layers A-B], --capture FILE --capture-positions\n"
    "                      last|all, --ffn-hist FILE --ffn-topk K (nothing is written)\n"
    "  --no-mmap / --mmap  read the weights into memory (huge pages) or map them; default: read them\n"
    "                      when they fit in available memory with a quarter to spare (the output says which)\n";

typedef struct bench_args {
    const char *model;
    long n_prompt, n_gen, depth, threads, reps, probe_mb;
    int json, no_probe, no_pair, load_mode;
    int gpu, phases;
    hook_opts hooks;
    kv_opts kv;
} bench_args;

static int parse_bench_args(int argc, char **argv, bench_args *a)
{
    static const char cmd[] = "bench";
    kv_opts_init(&a->kv);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v;
        long *target = NULL, lo = 0, hi = 0;
        const int kv = kv_opts_parse(&a->kv, argc, argv, &i, cmd);
        if (kv < 0) return 0;
        if (kv > 0) continue;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            fputs(bench_usage, stdout);
            exit(0);
        } else if (!strcmp(arg, "--json")) {
            a->json = 1;
        } else if (cli_load_flag(arg, &a->load_mode)) {
        } else if (!strcmp(arg, "--no-probe")) {
            a->no_probe = 1;
        } else if (!strcmp(arg, "--no-pair")) {
            a->no_pair = 1;
        } else if (!strcmp(arg, "--gpu")) {
            a->gpu = 1;
        } else if (!strcmp(arg, "--phases")) {
            a->phases = 1;
        } else if (!strncmp(arg, "--steer", 7) || !strncmp(arg, "--capture", 9) || !strncmp(arg, "--ffn-", 6)) {
            if (hook_opts_parse(&a->hooks, argc, argv, &i, cmd) != 1) return 0;
        } else if (!strcmp(arg, "-p") || !strcmp(arg, "--n-prompt")) {
            target = &a->n_prompt, lo = 0, hi = 1 << 20;
        } else if (!strcmp(arg, "-n") || !strcmp(arg, "--n-gen")) {
            target = &a->n_gen, lo = 0, hi = 1 << 20;
        } else if (!strcmp(arg, "-d") || !strcmp(arg, "--depth")) {
            target = &a->depth, lo = 0, hi = 1 << 24;
        } else if (!strcmp(arg, "-t") || !strcmp(arg, "--threads")) {
            target = &a->threads, lo = 1, hi = 4096;
        } else if (!strcmp(arg, "-r") || !strcmp(arg, "--reps")) {
            target = &a->reps, lo = 1, hi = 1000;
        } else if (!strcmp(arg, "--probe-mb")) {
            target = &a->probe_mb, lo = 1, hi = 1 << 20;
        } else if (arg[0] == '-') {
            fprintf(stderr, "spark bench: unknown option '%s' (spark bench --help)\n", arg);
            return 0;
        } else if (!a->model) {
            a->model = arg;
        } else {
            fprintf(stderr, "spark bench: unexpected argument '%s'\n", arg);
            return 0;
        }
        if (target && (!(v = cli_flag_value(argc, argv, &i, cmd)) || !cli_parse_int(cmd, arg, v, lo, hi, target)))
            return 0;
    }
    if (!a->model) {
        fprintf(stderr, "spark bench: MODEL is required (spark bench --help)\n");
        return 0;
    }
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- what the model costs ----------------------------------------------------- */

static int64_t matrix_params(const weight_ref *w) { return w->rows * w->cols; }

/* Multiply-add parameters one token passes through in the layers (no head). */
static int64_t layer_params(const spark_model *m)
{
    int64_t p = 0;
    for (int i = 0; i < m->cfg.n_layer; i++) {
        const layer_weights *L = &m->layers[i];
        p += matrix_params(&L->qkv) + matrix_params(&L->gate) + matrix_params(&L->out) +
             matrix_params(&L->ffn_gate) + matrix_params(&L->ffn_up) + matrix_params(&L->ffn_down);
    }
    return p;
}

/* Keys the token at position pos attends to in layer i. */
static int64_t visible_keys(const spark_model_config *c, int layer, int64_t pos)
{
    if (c->layer_kind[layer] == SPARK_LAYER_SLIDING && pos + 1 > c->sliding_window) return c->sliding_window;
    return pos + 1;
}

/* Flops of prefilling positions [0, n) with the head on the last token only:
 * 2 per multiply-add in the matrices, 4 per (query head, key, dim) in attention. */
static double prefill_flops(const spark_model *m, int64_t n)
{
    const spark_model_config *c = &m->cfg;
    double f = 2.0 * (double)layer_params(m) * (double)n + 2.0 * (double)matrix_params(&m->head);
    for (int i = 0; i < c->n_layer; i++)
        for (int64_t p = 0; p < n; p++) f += 4.0 * c->n_head * c->head_dim * (double)visible_keys(c, i, p);
    return f;
}

/* Bytes one decode step at position pos reads: every weight once, plus the
 * K and V rows of every visible key, in the cache format of the layer's
 * kind (o: the session's kv_full / kv_sliding). */
static double decode_bytes(const spark_model *m, const spark_session_options *o, int64_t pos)
{
    const spark_model_config *c = &m->cfg;
    double kv = 0;
    for (int i = 0; i < c->n_layer; i++) {
        const spark_kv_type t = c->layer_kind[i] == SPARK_LAYER_SLIDING ? o->kv_sliding : o->kv_full;
        const double row = (double)(kv_row_bytes(t, 0, c->head_dim) + kv_row_bytes(t, 1, c->head_dim));
        kv += (double)visible_keys(c, i, pos) * c->n_head_kv * row;
    }
    return (double)m->weight_bytes + kv;
}

static int64_t total_params(const spark_model *m)
{
    int64_t p = 0;
    for (int64_t i = 0; i < m->tensors->n_tensors; i++) p += tensor_numel(&m->tensors->tensors[i]);
    return p;
}

/* ---- the runs ---------------------------------------------------------------------- */

typedef struct stats {
    double mean, sd; /* tokens/s */
    double seconds;  /* mean seconds of one rep */
} stats;

static stats summarize(const double *sec, int reps, int64_t tokens)
{
    stats s = {0};
    for (int r = 0; r < reps; r++) {
        s.mean += (double)tokens / sec[r] / reps;
        s.seconds += sec[r] / reps;
    }
    for (int r = 0; r < reps; r++) s.sd += pow((double)tokens / sec[r] - s.mean, 2) / (reps > 1 ? reps - 1 : 1);
    s.sd = sqrt(s.sd);
    return s;
}

static void random_ids(int32_t *ids, int64_t n, int32_t vocab)
{
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)vocab);
    }
}

static spark_status run_prefill(spark_session *s, const int32_t *ids, int n, float *logits, int reps, double *sec)
{
    for (int r = 0; r < reps; r++) {
        spark_session_reset(s);
        double t0 = now_s();
        spark_status st = spark_session_eval(s, ids, n, logits, 0);
        sec[r] = now_s() - t0;
        if (st != SPARK_OK) return st;
    }
    return SPARK_OK;
}

/* An empty context, then the first `depth` ids evaluated (untimed): where
 * the decode tests start. */
static spark_status start_at_depth(spark_session *s, const int32_t *ids, int depth, float *logits)
{
    spark_session_reset(s);
    return depth > 0 ? spark_session_eval(s, ids, depth, logits, 0) : SPARK_OK;
}

static spark_status run_decode(spark_session *s, const int32_t *ids, int depth, int n, float *logits, int reps,
                               double *sec)
{
    for (int r = 0; r < reps; r++) {
        spark_status st = start_at_depth(s, ids, depth, logits);
        if (st != SPARK_OK) return st;
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            st = spark_session_eval(s, ids + depth + i, 1, logits, 0);
            if (st != SPARK_OK) return st;
        }
        sec[r] = now_s() - t0;
    }
    return SPARK_OK;
}

/* ---- report ---------------------------------------------------------------------- */

typedef struct bench_result {
    const bench_args *a;
    const spark_model *m;
    spark_session_options so; /* the session's (its KV formats count in decode_bytes) */
    int threads;
    double bw_gb_s, peak_gflop_s;
    double amx_gflop_s, pp_amx_pct; /* the AMX tile probe (0: none) and prefill vs its useful third */
    double bw_before, bw_after; /* the bandwidth probe before and after the tests; bw_gb_s = the larger */
    stats pp, tg;
    double pp_gflop_s, pp_peak_pct;
    double tg_bytes, tg_gb_s, floor_tok_s, floor_pct;
    /* the paired decode test (run_paired): per token, its GB/s over the faster
     * neighbouring pass of the probe's loop on the weights, in % */
    int paired;                /* tokens paired (0: not run) */
    double pair_pct[5];        /* min, 25th percentile, median, 75th, max */
    double pair_probe_gb_s[3]; /* the passes' GB/s: min, median, max */
    double pair_tok_s;         /* tokens / the paired tokens' summed time */
    /* the test's own ceiling: a single pass of the probe's loop in its best
     * form, taken from inside reading k and set against readings k - 1 and
     * k + 1 as a token is against its two (run_paired) */
    int self_paired;           /* passes scored so (0: fewer than 2 tokens) */
    int self_form;             /* the form used (cpu_probe_form_name) */
    double self_pct[3];        /* 25th percentile, median, 75th */
} bench_result;

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (slash && slash[1]) return slash + 1;
    return path;
}

static void print_json(const bench_result *r)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return;
    cJSON_AddStringToObject(o, "model", base_name(r->a->model));
    cJSON_AddStringToObject(o, "backend", r->a->gpu ? "cuda" : "cpu"); /* cuda: the probes are the GPU's */
    cJSON_AddStringToObject(o, "cpu", cpu_model_name());
    cJSON_AddStringToObject(o, "isa", cpu_isa_name(cpu_isa_active()));
    cJSON_AddNumberToObject(o, "threads", r->threads);
    cJSON_AddNumberToObject(o, "weights_bytes", (double)r->m->weight_bytes);
    cJSON_AddNumberToObject(o, "params", (double)total_params(r->m));
    cJSON_AddNumberToObject(o, "reps", (double)r->a->reps);
    cJSON_AddNumberToObject(o, "pp_tokens", (double)r->a->n_prompt);
    cJSON_AddNumberToObject(o, "pp_tok_s", r->pp.mean);
    cJSON_AddNumberToObject(o, "pp_tok_s_sd", r->pp.sd);
    cJSON_AddNumberToObject(o, "pp_gflop_s", r->pp_gflop_s);
    cJSON_AddNumberToObject(o, "fma_peak_gflop_s", r->peak_gflop_s);
    cJSON_AddNumberToObject(o, "pp_peak_pct", r->pp_peak_pct);
    if (r->amx_gflop_s > 0) {
        cJSON_AddNumberToObject(o, "amx_peak_gflop_s", r->amx_gflop_s);
        cJSON_AddNumberToObject(o, "pp_amx_useful_pct", r->pp_amx_pct);
    }
    cJSON_AddNumberToObject(o, "tg_tokens", (double)r->a->n_gen);
    cJSON_AddNumberToObject(o, "tg_depth", (double)r->a->depth);
    cJSON_AddNumberToObject(o, "tg_tok_s", r->tg.mean);
    cJSON_AddNumberToObject(o, "tg_tok_s_sd", r->tg.sd);
    cJSON_AddNumberToObject(o, "tg_bytes_per_token", r->tg_bytes);
    cJSON_AddStringToObject(o, "kv_type", spark_kv_type_name(r->so.kv_full));
    cJSON_AddStringToObject(o, "kv_type_sliding", spark_kv_type_name(r->so.kv_sliding));
    cJSON_AddNumberToObject(o, "tg_gb_s", r->tg_gb_s);
    cJSON_AddNumberToObject(o, "bandwidth_gb_s", r->bw_gb_s);
    cJSON_AddNumberToObject(o, "bandwidth_before_gb_s", r->bw_before);
    cJSON_AddNumberToObject(o, "bandwidth_after_gb_s", r->bw_after);
    cJSON_AddNumberToObject(o, "floor_tok_s", r->floor_tok_s);
    cJSON_AddNumberToObject(o, "floor_pct", r->floor_pct);
    if (r->paired) {
        cJSON_AddNumberToObject(o, "paired_tokens", r->paired);
        cJSON_AddNumberToObject(o, "paired_tok_s", r->pair_tok_s);
        cJSON_AddNumberToObject(o, "paired_pct_median", r->pair_pct[2]);
        cJSON_AddNumberToObject(o, "paired_pct_p25", r->pair_pct[1]);
        cJSON_AddNumberToObject(o, "paired_pct_p75", r->pair_pct[3]);
        cJSON_AddNumberToObject(o, "paired_pct_min", r->pair_pct[0]);
        cJSON_AddNumberToObject(o, "paired_pct_max", r->pair_pct[4]);
        cJSON_AddNumberToObject(o, "paired_probe_gb_s_min", r->pair_probe_gb_s[0]);
        cJSON_AddNumberToObject(o, "paired_probe_gb_s_median", r->pair_probe_gb_s[1]);
        cJSON_AddNumberToObject(o, "paired_probe_gb_s_max", r->pair_probe_gb_s[2]);
    }
    if (r->self_paired) {
        cJSON_AddNumberToObject(o, "paired_self_passes", r->self_paired);
        cJSON_AddNumberToObject(o, "paired_self_pct_median", r->self_pct[1]);
        cJSON_AddNumberToObject(o, "paired_self_pct_p25", r->self_pct[0]);
        cJSON_AddNumberToObject(o, "paired_self_pct_p75", r->self_pct[2]);
    }
    const spark_model_load_info *li = spark_model_get_load_info(r->m);
    cJSON_AddStringToObject(o, "load_mode", spark_load_mode_name(li->mode));
    cJSON_AddBoolToObject(o, "huge_pages", li->huge_pages);
    cJSON_AddStringToObject(o, "thp", thp_setting_name(mapped_file_thp_setting()));
    cJSON_AddStringToObject(o, "load_note", li->why);
    char *text = cJSON_PrintUnformatted(o);
    if (text) puts(text);
    free(text);
    cJSON_Delete(o);
}

static void print_table(const bench_result *r)
{
    const bench_args *a = r->a;
    char backend_name[64];
    if (a->gpu) snprintf(backend_name, sizeof backend_name, "cuda");
    else snprintf(backend_name, sizeof backend_name, "cpu %s", cpu_isa_name(cpu_isa_active()));
    printf("cpu: %s (%s%s%s)\n\n", cpu_model_name(), cpu_isa_name(cpu_isa_active()),
           *cpu_feature_string() ? ", " : "", cpu_feature_string());
    printf("| %-28s | %10s | %8s | %-12s | %7s | %11s | %16s |\n", "model", "size", "params", "backend", "threads",
           "test", "t/s");
    printf("| %.28s | %.10s | %.8s | %.12s | %.7s | %.11s | %.16s |\n", "------------------------------",
           "------------", "----------", "--------------", "---------", "-------------", "------------------");
    char size[32], params[32], test[16], rate[32];
    snprintf(size, sizeof size, "%.2f GiB", (double)r->m->weight_bytes / (1024.0 * 1024 * 1024));
    snprintf(params, sizeof params, "%.2f B", (double)total_params(r->m) / 1e9);
    if (a->n_prompt > 0) {
        snprintf(test, sizeof test, "pp%ld", a->n_prompt);
        snprintf(rate, sizeof rate, "%.2f ± %.2f", r->pp.mean, r->pp.sd);
        printf("| %-28.28s | %10s | %8s | %-12s | %7d | %11s | %16s |\n", base_name(a->model), size, params,
               backend_name, r->threads, test, rate);
    }
    if (a->n_gen > 0) {
        if (a->depth > 0) snprintf(test, sizeof test, "tg%ld@d%ld", a->n_gen, a->depth);
        else snprintf(test, sizeof test, "tg%ld", a->n_gen);
        snprintf(rate, sizeof rate, "%.2f ± %.2f", r->tg.mean, r->tg.sd);
        printf("| %-28.28s | %10s | %8s | %-12s | %7d | %11s | %16s |\n", base_name(a->model), size, params,
               backend_name, r->threads, test, rate);
    }
    printf("\n");
    const spark_model_load_info *li = spark_model_get_load_info(r->m);
    printf("weights: %s\n", li->why);
    if (!a->no_probe && a->gpu)
        printf("GPU memory bandwidth (probe: device-to-device copy, read + write): %.1f GB/s\n", r->bw_gb_s);
    else if (!a->no_probe)
        printf("memory bandwidth (probe, %d threads): %.1f GB/s (the better of %.1f before and %.1f after the tests)\n",
               r->threads, r->bw_gb_s, r->bw_before, r->bw_after);
    if (a->n_gen > 0)
        printf("decode: %.3f GB/token (KV cache %s / sliding %s) -> %.1f GB/s achieved; floor %.2f tok/s; %.1f%% of "
               "the floor\n",
               r->tg_bytes / 1e9, spark_kv_type_name(r->so.kv_full), spark_kv_type_name(r->so.kv_sliding), r->tg_gb_s,
               r->floor_tok_s, r->floor_pct);
    if (r->paired)
        printf("decode, paired with the probe's loop over the weights (%d tokens, %.2f tok/s; passes %.1f-%.1f "
               "GB/s, median %.1f): %.1f%% of the floor, median (quartiles %.1f-%.1f, range %.1f-%.1f)\n",
               r->paired, r->pair_tok_s, r->pair_probe_gb_s[0], r->pair_probe_gb_s[2], r->pair_probe_gb_s[1],
               r->pair_pct[2], r->pair_pct[1], r->pair_pct[3], r->pair_pct[0], r->pair_pct[4]);
    if (r->self_paired)
        printf("the paired test's own ceiling: one plain pass of the probe's loop (%s form), scored as a token is, "
               "%.1f%% median (quartiles %.1f-%.1f, %d passes)\n",
               cpu_probe_form_name(r->self_form), r->self_pct[1],
               r->self_pct[0], r->self_pct[2], r->self_paired);
    if (!a->no_probe && a->gpu)
        printf("GPU matrix peak (probe: cuBLAS bf16 GEMM 8192^3, fp32 accumulate): %.1f TFLOP/s\n",
               r->peak_gflop_s / 1e3);
    else if (!a->no_probe)
        printf("FMA peak (probe, %d threads): %.1f GFLOP/s\n", r->threads, r->peak_gflop_s);
    if (r->amx_gflop_s > 0)
        printf("AMX bf16 tile peak (probe, %d threads): %.1f GFLOP/s; bf16 weights' prefill runs 3 tile products "
               "per float32 product: useful peak %.1f GFLOP/s\n",
               r->threads, r->amx_gflop_s, r->amx_gflop_s / 3);
    if (a->n_prompt > 0)
        printf("prefill: %.1f GFLOP/s; %.1f%% of the %s peak\n", r->pp_gflop_s, r->pp_peak_pct,
               a->gpu ? "bf16 matrix" : "FMA");
    if (a->n_prompt > 0 && r->amx_gflop_s > 0)
        printf("prefill: %.1f%% of the AMX useful peak\n", r->pp_amx_pct);
}

static void derive(bench_result *r)
{
    const bench_args *a = r->a;
    if (a->n_prompt > 0) {
        r->pp_gflop_s = prefill_flops(r->m, a->n_prompt) / r->pp.seconds / 1e9;
        r->pp_peak_pct = r->peak_gflop_s > 0 ? 100.0 * r->pp_gflop_s / r->peak_gflop_s : 0;
        r->pp_amx_pct = r->amx_gflop_s > 0 ? 100.0 * r->pp_gflop_s / (r->amx_gflop_s / 3) : 0;
    }
    if (a->n_gen > 0) {
        double bytes = 0;
        for (int64_t p = a->depth; p < a->depth + a->n_gen; p++) bytes += decode_bytes(r->m, &r->so, p);
        r->tg_bytes = bytes / (double)a->n_gen;
        r->tg_gb_s = r->tg_bytes * r->tg.mean / 1e9;
        r->floor_tok_s = r->bw_gb_s > 0 ? r->bw_gb_s * 1e9 / r->tg_bytes : 0;
        r->floor_pct = r->bw_gb_s > 0 ? 100.0 * r->tg_gb_s / r->bw_gb_s : 0;
    }
}

/* ---- the paired decode test ------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* q-quantile of sorted v[0..n) (linear between neighbours). */
static double quantile(const double *v, int n, double q)
{
    double at = q * (n - 1);
    int i = (int)at;
    return i + 1 < n ? v[i] + (at - i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* The memory the forward pass streams per token: every bound matrix (the
 * tied head is the embedding). The norm vectors are float copies of a few KB
 * and are left out; the probe's rate is over the bytes it reads. */
static int weight_regions(const spark_model *m, probe_region *out, int cap)
{
    int n = 0;
#define ADD_REGION(W)                                                                                 \
    do {                                                                                              \
        if (n < cap) out[n++] = (probe_region){(W).data, (size_t)dtype_row_bytes((W).dtype, (uint64_t)(W).cols) * (size_t)(W).rows}; \
    } while (0)
    ADD_REGION(m->embedding);
    if (!m->tied_head) ADD_REGION(m->head);
    for (int i = 0; i < m->cfg.n_layer; i++) {
        const layer_weights *L = &m->layers[i];
        ADD_REGION(L->qkv);
        ADD_REGION(L->gate);
        ADD_REGION(L->out);
        ADD_REGION(L->ffn_gate);
        ADD_REGION(L->ffn_up);
        ADD_REGION(L->ffn_down);
    }
#undef ADD_REGION
    return n;
}

/* A short sleep before each timed step, so the other pool's workers (the
 * session's or the probe's) have stopped spinning and both cores are free. */
static void settle(void) { usleep(3000); }

/* The paired test's ceiling: a token is one timed pass, its floor the
 * fastest of 2 x CPU_PROBE_FORMS (every form in each neighbouring reading), and the
 * machine's bandwidth moves from pass to pass, so even a plain read scores
 * below 100 % on this test. Reading k's pass in the form fastest over the
 * whole test (by median) stands in for a token between readings k - 1 and
 * k + 1, and is scored the same way. */
static void score_self(const double *pass, double (*form)[CPU_PROBE_FORMS], int n, bench_result *r)
{
    if (n < 2) return;
    double med[CPU_PROBE_FORMS], *v = malloc((size_t)(n + 1) * sizeof *v);
    if (!v) return;
    int f_best = 0;
    for (int f = 0; f < CPU_PROBE_FORMS; f++) {
        for (int k = 0; k <= n; k++) v[k] = form[k][f];
        qsort(v, (size_t)n + 1, sizeof *v, cmp_double);
        med[f] = quantile(v, n + 1, 0.5);
        if (med[f] < med[f_best]) f_best = f;
    }
    for (int k = 1; k < n; k++) {
        double best = pass[k - 1] < pass[k + 1] ? pass[k - 1] : pass[k + 1];
        v[k - 1] = 100.0 * best / form[k][f_best];
    }
    qsort(v, (size_t)n - 1, sizeof *v, cmp_double);
    for (int q = 0; q < 3; q++) r->self_pct[q] = quantile(v, n - 1, (q + 1) / 4.0);
    r->self_form = f_best;
    r->self_paired = n - 1;
    free(v);
}

/* tg<N> once more from an empty context, with a reading of the probe's loop
 * over the weights (cpu_probe_read_forms: the fastest of one pass in each
 * prefetch form) before the first token and after every token. Token i is
 * set against the faster of passes i and i + 1 (the stricter of its two
 * neighbours): 100 * (its bytes / its time) / (pass bytes / pass time). */
static spark_status run_paired(spark_session *s, const spark_model *m, const int32_t *ids, int depth, int n,
                               float *logits, int threads, bench_result *r)
{
    int cap = 2 + 6 * m->cfg.n_layer;
    probe_region *reg = malloc((size_t)cap * sizeof *reg);
    double *pass = malloc((size_t)(n + 1) * sizeof *pass), *pct = malloc((size_t)n * sizeof *pct);
    double (*form)[CPU_PROBE_FORMS] = malloc((size_t)(n + 1) * sizeof *form);
    thread_pool *pool = NULL;
    spark_status st = reg && pass && pct && form ? pool_create(threads, &pool) : SPARK_ERR_NOMEM;
    if (st != SPARK_OK) goto done;
    int nreg = weight_regions(m, reg, cap);
    size_t read = 0;
    double tok_sum = 0;
    cpu_probe_read_pass(pool, reg, nreg, &read); /* warm-up: threads started, TLB walked once */
    st = start_at_depth(s, ids, depth, logits);
    if (st != SPARK_OK) goto done;
    settle();
    pass[0] = cpu_probe_read_forms(pool, reg, nreg, &read, form[0]);
    for (int i = 0; i < n && st == SPARK_OK; i++) {
        settle();
        double t0 = now_s();
        st = spark_session_eval(s, ids + depth + i, 1, logits, 0);
        double t = now_s() - t0;
        tok_sum += t;
        settle();
        pass[i + 1] = cpu_probe_read_forms(pool, reg, nreg, &read, form[i + 1]);
        double best = pass[i] < pass[i + 1] ? pass[i] : pass[i + 1];
        pct[i] = 100.0 * (decode_bytes(m, &r->so, depth + i) / t) / ((double)read / best);
    }
    if (st != SPARK_OK || read == 0) goto done;
    score_self(pass, form, n, r);
    qsort(pct, (size_t)n, sizeof *pct, cmp_double);
    for (int k = 0; k < 5; k++) r->pair_pct[k] = quantile(pct, n, k / 4.0);
    for (int i = 0; i <= n; i++) pass[i] = (double)read / pass[i] / 1e9; /* GB/s */
    qsort(pass, (size_t)n + 1, sizeof *pass, cmp_double);
    r->pair_probe_gb_s[0] = pass[0];
    r->pair_probe_gb_s[1] = quantile(pass, n + 1, 0.5);
    r->pair_probe_gb_s[2] = pass[n];
    r->pair_tok_s = n / tok_sum;
    r->paired = n;
done:
    pool_free(pool);
    free(reg);
    free(pass);
    free(pct);
    free(form);
    return st;
}

/* Positions the tests fill: the prompt test's, or the decode test's depth + tokens. */
static int64_t bench_positions(const bench_args *a)
{
    const int64_t decoded = a->n_gen > 0 ? a->depth + a->n_gen : 0;
    return a->n_prompt > decoded ? a->n_prompt : decoded;
}

static spark_status run_all(spark_model *m, const bench_args *a, bench_result *r)
{
    if (!a->no_probe && a->gpu) {
        fprintf(stderr, "spark bench: probing the GPU's copy bandwidth and bf16 matrix peak...\n");
        double tflops = 0;
        spark_status st = backend_cuda_probe(0, (size_t)a->probe_mb << 20, &r->bw_before, &tflops);
        if (st != SPARK_OK) return st;
        r->bw_gb_s = r->bw_after = r->bw_before;
        r->peak_gflop_s = tflops * 1e3;
    } else if (!a->no_probe) {
        fprintf(stderr, "spark bench: probing memory bandwidth and FMA peak...\n");
        spark_status st = cpu_probe_bandwidth(r->threads, (size_t)a->probe_mb << 20, 5, &r->bw_before);
        r->bw_gb_s = r->bw_before;
        if (st == SPARK_OK) st = cpu_probe_fma_peak(r->threads, 3, &r->peak_gflop_s);
        /* bf16 weights prefill on AMX tiles where the CPU has them (amx.c): their peak too */
        if (st == SPARK_OK && m->cfg.n_layer > 0 && m->layers[0].qkv.dtype == SPARK_DTYPE_BF16)
            st = cpu_probe_amx_peak(r->threads, 3, &r->amx_gflop_s);
        if (st != SPARK_OK) return st;
    }
    spark_session_options o = spark_session_default_options();
    const int64_t ctx = bench_positions(a);
    o.n_ctx = (int32_t)(ctx + 1 < m->cfg.max_ctx ? ctx + 1 : m->cfg.max_ctx); /* cmd_bench checked ctx */
    const int64_t chunk = a->n_prompt > a->depth ? a->n_prompt : a->depth; /* the longest evaluation of many tokens */
    o.n_batch = chunk > 0 ? (int32_t)(chunk < 512 ? chunk : 512) : 1;
    o.n_threads = r->threads;
    if (a->gpu) o.backend = SPARK_BACKEND_CUDA;
    kv_opts_apply(&a->kv, &o);
    r->so = o;
    spark_session *s = NULL;
    int32_t *ids = malloc((size_t)(ctx + 1) * sizeof *ids);
    float *logits = malloc((size_t)m->cfg.n_vocab * sizeof *logits);
    double *sec = malloc((size_t)a->reps * sizeof *sec);
    spark_status st = ids && logits && sec ? spark_session_create(m, &o, &s) : SPARK_ERR_NOMEM;
    if (st == SPARK_OK && hook_opts_apply(&a->hooks, m, s, (int32_t)(a->n_gen > 0 ? a->n_gen - 1 : 0), "bench"))
        st = SPARK_ERR_ARG;
    if (st == SPARK_OK) {
        random_ids(ids, ctx + 1, m->cfg.n_vocab);
        /* a first pass pages the weights in, and a first prefill pays its
         * shapes' one-time costs (GPU library plans, kernels loaded on first
         * use); neither belongs in the figures (llama-bench warms up alike) */
        fprintf(stderr, "spark bench: warming up (an untimed %s)...\n", a->n_prompt > 0 ? "prefill" : "token");
        st = a->n_prompt > 0 ? run_prefill(s, ids, (int)a->n_prompt, logits, 1, sec)
                             : run_decode(s, ids, (int)a->depth, 1, logits, 1, sec);
    }
    if (st == SPARK_OK && a->n_prompt > 0) {
        st = run_prefill(s, ids, (int)a->n_prompt, logits, (int)a->reps, sec);
        r->pp = summarize(sec, (int)a->reps, a->n_prompt);
    }
    if (st == SPARK_OK && a->n_gen > 0) {
        if (a->phases) spark_session_timing(s, 1);
        st = run_decode(s, ids, (int)a->depth, (int)a->n_gen, logits, (int)a->reps, sec);
        r->tg = summarize(sec, (int)a->reps, a->n_gen);
        if (st == SPARK_OK && a->phases) {
            fprintf(stderr, "spark bench: decode test, %ld x %ld tokens:\n", a->reps, a->n_gen);
            hook_opts_print_timing(s, stderr);
        }
    }
    if (st == SPARK_OK && a->n_gen > 0 && !a->no_probe && !a->no_pair && !a->gpu) {
        if (a->phases) spark_session_timing(s, 0);
        fprintf(stderr, "spark bench: paired decode test (a probe pass over the weights between tokens)...\n");
        st = run_paired(s, m, ids, (int)a->depth, (int)a->n_gen, logits, r->threads, r);
    }
    spark_session_free(s);
    free(ids);
    free(logits);
    free(sec);
    /* probe again: on a shared machine the bandwidth drifts while the tests
     * run, and the floor is what the memory can do, so the better reading counts */
    if (st == SPARK_OK && !a->no_probe && !a->gpu) {
        st = cpu_probe_bandwidth(r->threads, (size_t)a->probe_mb << 20, 5, &r->bw_after);
        if (r->bw_after > r->bw_gb_s) r->bw_gb_s = r->bw_after;
    }
    return st;
}

int cmd_bench(int argc, char **argv)
{
    bench_args a = {.n_prompt = 512, .n_gen = 128, .reps = 1};
    hook_opts_init(&a.hooks);
    if (!parse_bench_args(argc, argv, &a)) return EXIT_USAGE;
    if (!a.probe_mb) a.probe_mb = a.gpu ? 2048 : 1024; /* the GPU's 50 MB L2 wants a larger copy */
    spark_model *m = NULL;
    if (cli_load_model(a.model, a.load_mode, a.gpu, &m) != SPARK_OK) return cli_report_error("bench");
    const spark_model_load_info *li = spark_model_get_load_info(m);
    fprintf(stderr, "spark bench: weights %s (%.1f s)\n", li->why, li->seconds);
    if (bench_positions(&a) > m->cfg.max_ctx) {
        fprintf(stderr, "spark bench: the tests fill %lld positions (-p, or -d + -n); %s takes at most %d\n",
                (long long)bench_positions(&a), a.model, m->cfg.max_ctx);
        spark_model_free(m);
        return EXIT_USAGE;
    }
    bench_result r = {.a = &a, .m = m, .threads = a.threads > 0 ? (int)a.threads : cpu_physical_cores()};
    if (run_all(m, &a, &r) != SPARK_OK) {
        spark_model_free(m);
        return cli_report_error("bench");
    }
    derive(&r);
    if (a.json) print_json(&r);
    else print_table(&r);
    spark_model_free(m);
    return 0;
}

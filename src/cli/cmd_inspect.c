/*
 * cmd_inspect.c — `spark inspect`: what a checkpoint is (hyper-parameters,
 * layer pattern, tensor census by dtype) and what it costs to run (weight
 * bytes per token; KV cache bytes per position, of the sliding rings and at
 * a context, for the chosen KV format and as a table over every format).
 */
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/kv_opts.h"

#include "model/model.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char inspect_usage[] =
    "usage: spark inspect MODEL [--json] [--ctx N] [--kv-type T] [--kv-bits B] [--kv-layers L]\n"
    "\n"
    "Prints the architecture, every hyper-parameter, a tensor census by dtype,\n"
    "bytes of weights, and KV-cache bytes per position and at a context: for the\n"
    "format the KV options choose, and a table over every format.\n"
    "\n"
    "  --json                  one JSON object instead of text\n"
    "  --ctx N                 the context the KV totals are for (default: the model's maximum)\n"
    KV_OPTS_HELP;

/* The KV formats of the table: every float type, then every TurboQuant width. */
static const spark_kv_type TABLE_TYPES[] = {SPARK_KV_F32, SPARK_KV_F16, SPARK_KV_BF16, SPARK_KV_TQ4,
                                            SPARK_KV_TQ3_5, SPARK_KV_TQ3, SPARK_KV_TQ2};
enum { N_TABLE_TYPES = sizeof TABLE_TYPES / sizeof TABLE_TYPES[0] };

typedef struct inspect_args {
    const char *path;
    int json;
    long ctx;
    kv_opts kv;
} inspect_args;

typedef struct census {
    int64_t count[SPARK_DTYPE_COUNT];
    uint64_t bytes[SPARK_DTYPE_COUNT];
    int64_t params;
} census;

static census take_census(const spark_model *m)
{
    census c = {0};
    for (int64_t i = 0; i < m->tensors->n_tensors; i++) {
        const tensor_info *t = &m->tensors->tensors[i];
        c.count[t->dtype]++;
        c.bytes[t->dtype] += t->nbytes;
        c.params += tensor_numel(t);
    }
    return c;
}

/* KV bytes of the sessions options `o` (n_ctx set) would hold; 0 if the
 * model cannot use the format. */
static int kv_memory(const spark_model *m, spark_kv_type full, spark_kv_type sliding, long ctx,
                     spark_session_memory *out)
{
    spark_session_options o = spark_session_default_options();
    o.n_ctx = (int32_t)ctx;
    o.kv_full = full;
    o.kv_sliding = sliding;
    return spark_session_memory_estimate(m, &o, out) == SPARK_OK;
}

/* "12.345 GB" / "MB" / "kB" / "B": a size in the unit that keeps it readable. */
static const char *fmt_bytes(char *buf, size_t cap, uint64_t bytes)
{
    if (bytes >= 1000000000ull) snprintf(buf, cap, "%.3f GB", bytes / 1e9);
    else if (bytes >= 1000000ull) snprintf(buf, cap, "%.3f MB", bytes / 1e6);
    else if (bytes >= 1000ull) snprintf(buf, cap, "%.3f kB", bytes / 1e3);
    else snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
    return buf;
}

static int count_kind(const spark_model_config *c, spark_layer_kind kind)
{
    int n = 0;
    for (int i = 0; i < c->n_layer; i++) n += c->layer_kind[i] == kind;
    return n;
}

static void layer_pattern(const spark_model_config *c, char *out, size_t cap)
{
    size_t n = 0;
    for (int i = 0; i < c->n_layer && n + 1 < cap; i++) out[n++] = c->layer_kind[i] == SPARK_LAYER_SLIDING ? 'S' : 'F';
    out[n] = '\0';
}

/* The KV lines: the chosen format, then the table over every format. */
static void print_kv_text(const spark_model *m, const inspect_args *a)
{
    const spark_model_config *c = &m->cfg;
    spark_session_options o = spark_session_default_options();
    o.n_ctx = (int32_t)a->ctx;
    kv_opts_apply(&a->kv, &o);
    spark_session_memory mem;
    char b1[32], b2[32], b3[32];
    if (!kv_memory(m, o.kv_full, o.kv_sliding, a->ctx, &mem)) {
        printf("KV cache     %s / %s: %s\n", spark_kv_type_name(o.kv_full), spark_kv_type_name(o.kv_sliding),
               spark_last_error());
    } else {
        printf("KV cache     full layers %s, sliding rings %s: %llu bytes per position + %s of rings\n",
               spark_kv_type_name(o.kv_full), spark_kv_type_name(o.kv_sliding),
               (unsigned long long)mem.kv_per_token, fmt_bytes(b1, sizeof b1, mem.kv_sliding));
        printf("KV cache at context %ld: %s\n", a->ctx, fmt_bytes(b1, sizeof b1, mem.kv_bytes));
    }
    printf("KV cache by format at %ld positions (rings: the sliding layers' %d-position buffers;\n"
           "TurboQuant on full layers only keeps the rings in %s, --kv-layers all quantizes them too):\n",
           a->ctx, c->sliding_window, spark_kv_type_name(a->kv.base));
    printf("  %-6s %10s %14s %12s %12s | %-16s %12s %12s\n", "format", "bits/value", "bytes/position", "rings",
           "total", "--kv-layers all", "rings", "total");
    for (int i = 0; i < N_TABLE_TYPES; i++) {
        spark_kv_type t = TABLE_TYPES[i];
        int tq = t >= SPARK_KV_TQ2;
        spark_session_memory full, all;
        if (!kv_memory(m, t, tq ? a->kv.base : t, a->ctx, &full)) {
            printf("  %-6s %s\n", spark_kv_type_name(t), spark_last_error());
            continue;
        }
        printf("  %-6s %10.3f %14llu %12s %12s |", spark_kv_type_name(t), spark_kv_type_bits(t, c->head_dim),
               (unsigned long long)full.kv_per_token, fmt_bytes(b1, sizeof b1, full.kv_sliding),
               fmt_bytes(b2, sizeof b2, full.kv_bytes));
        if (tq && kv_memory(m, t, t, a->ctx, &all))
            printf(" %-16s %12s %12s", "", fmt_bytes(b1, sizeof b1, all.kv_sliding),
                   fmt_bytes(b3, sizeof b3, all.kv_bytes));
        printf("\n");
    }
}

static void print_text(const spark_model *m, const inspect_args *a)
{
    const spark_model_config *c = &m->cfg;
    census cs = take_census(m);
    char pattern[8192];
    layer_pattern(c, pattern, sizeof pattern);
    printf("model        %s (%s)\n", m->path, m->format == MODEL_FORMAT_GGUF ? "GGUF" : "Hugging Face safetensors");
    printf("architecture spark2_5\n");
    printf("hidden %d, ffn %d, layers %d, heads %d / kv heads %d, head_dim %d, vocab %d\n", c->n_embd, c->n_ff,
           c->n_layer, c->n_head, c->n_head_kv, c->head_dim, c->n_vocab);
    printf("layers       %s  (S = sliding window %d, F = full; %d full, %d sliding)\n", pattern, c->sliding_window,
           count_kind(c, SPARK_LAYER_FULL), count_kind(c, SPARK_LAYER_SLIDING));
    printf("rope         full: %d dims, theta %g; sliding: %d dims, theta %g\n", c->rope_dim_full,
           (double)c->rope_theta_full, c->rope_dim_sliding, (double)c->rope_theta_sliding);
    printf("rms eps %g, max context %d, bos %d, eos %d, pad %d, head %s\n", (double)c->rms_eps, c->max_ctx, c->bos_id,
           c->eos_id, c->pad_id, m->tied_head ? "tied to the embedding" : "separate");
    printf("tensors      %lld, %lld parameters\n", (long long)m->tensors->n_tensors, (long long)cs.params);
    for (int d = 0; d < SPARK_DTYPE_COUNT; d++)
        if (cs.count[d])
            printf("  %-6s %6lld tensors %12.3f MB\n", dtype_name((spark_dtype)d), (long long)cs.count[d],
                   cs.bytes[d] / 1e6);
    printf("weights read per token  %.3f MB\n", m->weight_bytes / 1e6);
    print_kv_text(m, a);
}

static void add_kv_format(cJSON *list, const spark_model *m, spark_kv_type full, spark_kv_type sliding,
                          const char *layers, long ctx)
{
    spark_session_memory mem;
    if (!kv_memory(m, full, sliding, ctx, &mem)) return; /* a format this model cannot use */
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "type", spark_kv_type_name(full));
    cJSON_AddStringToObject(e, "layers", layers);
    cJSON_AddStringToObject(e, "sliding_type", spark_kv_type_name(sliding));
    cJSON_AddNumberToObject(e, "bits_per_value", spark_kv_type_bits(full, m->cfg.head_dim));
    cJSON_AddNumberToObject(e, "bytes_per_token", (double)mem.kv_per_token);
    cJSON_AddNumberToObject(e, "sliding_bytes", (double)mem.kv_sliding);
    cJSON_AddNumberToObject(e, "bytes_at_context", (double)mem.kv_bytes);
    cJSON_AddItemToArray(list, e);
}

/* The chosen format's totals (the keys older readers know), then every format. */
static void add_kv_json(cJSON *o, const spark_model *m, const inspect_args *a)
{
    spark_session_options so = spark_session_default_options();
    kv_opts_apply(&a->kv, &so);
    spark_session_memory mem;
    if (kv_memory(m, so.kv_full, so.kv_sliding, a->ctx, &mem)) {
        cJSON_AddStringToObject(o, "kv_dtype", spark_kv_type_name(so.kv_full));
        cJSON_AddStringToObject(o, "kv_dtype_sliding", spark_kv_type_name(so.kv_sliding));
        cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)mem.kv_per_token);
        cJSON_AddNumberToObject(o, "kv_bytes_sliding", (double)mem.kv_sliding);
        cJSON_AddNumberToObject(o, "kv_context", (double)a->ctx);
        cJSON_AddNumberToObject(o, "kv_bytes_context", (double)mem.kv_bytes);
    }
    spark_session_memory max;
    if (kv_memory(m, so.kv_full, so.kv_sliding, m->cfg.max_ctx, &max))
        cJSON_AddNumberToObject(o, "kv_bytes_max_context", (double)max.kv_bytes);
    cJSON *list = cJSON_AddArrayToObject(o, "kv_formats");
    for (int i = 0; i < N_TABLE_TYPES; i++) {
        spark_kv_type t = TABLE_TYPES[i];
        if (t >= SPARK_KV_TQ2) add_kv_format(list, m, t, a->kv.base, "full", a->ctx);
        add_kv_format(list, m, t, t, "all", a->ctx);
    }
}

static void print_json(const spark_model *m, const inspect_args *a)
{
    const spark_model_config *c = &m->cfg;
    census cs = take_census(m);
    char pattern[8192];
    layer_pattern(c, pattern, sizeof pattern);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", m->path);
    cJSON_AddStringToObject(o, "format", m->format == MODEL_FORMAT_GGUF ? "gguf" : "hf");
    cJSON_AddStringToObject(o, "architecture", "spark2_5");
    cJSON_AddNumberToObject(o, "hidden_size", c->n_embd);
    cJSON_AddNumberToObject(o, "intermediate_size", c->n_ff);
    cJSON_AddNumberToObject(o, "num_layers", c->n_layer);
    cJSON_AddNumberToObject(o, "num_heads", c->n_head);
    cJSON_AddNumberToObject(o, "num_kv_heads", c->n_head_kv);
    cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(o, "vocab_size", c->n_vocab);
    cJSON_AddNumberToObject(o, "max_context", c->max_ctx);
    cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
    cJSON_AddStringToObject(o, "layer_pattern", pattern);
    cJSON_AddNumberToObject(o, "rope_dims_full", c->rope_dim_full);
    cJSON_AddNumberToObject(o, "rope_theta_full", c->rope_theta_full);
    cJSON_AddNumberToObject(o, "rope_dims_sliding", c->rope_dim_sliding);
    cJSON_AddNumberToObject(o, "rope_theta_sliding", c->rope_theta_sliding);
    cJSON_AddNumberToObject(o, "rms_norm_eps", c->rms_eps);
    cJSON_AddNumberToObject(o, "bos_id", c->bos_id);
    cJSON_AddNumberToObject(o, "eos_id", c->eos_id);
    cJSON_AddNumberToObject(o, "pad_id", c->pad_id);
    cJSON_AddBoolToObject(o, "tied_head", m->tied_head);
    cJSON_AddNumberToObject(o, "n_tensors", (double)m->tensors->n_tensors);
    cJSON_AddNumberToObject(o, "n_params", (double)cs.params);
    cJSON *by = cJSON_AddObjectToObject(o, "tensors_by_dtype");
    for (int d = 0; d < SPARK_DTYPE_COUNT; d++) {
        if (!cs.count[d]) continue;
        cJSON *e = cJSON_AddObjectToObject(by, dtype_name((spark_dtype)d));
        cJSON_AddNumberToObject(e, "count", (double)cs.count[d]);
        cJSON_AddNumberToObject(e, "bytes", (double)cs.bytes[d]);
    }
    cJSON_AddNumberToObject(o, "weight_bytes", (double)m->weight_bytes);
    add_kv_json(o, m, a);
    char *text = cJSON_Print(o);
    if (text) puts(text);
    free(text);
    cJSON_Delete(o);
}

static int parse_inspect(int argc, char **argv, inspect_args *a)
{
    kv_opts_init(&a->kv);
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r = kv_opts_parse(&a->kv, argc, argv, &i, "inspect");
        if (r < 0) return 0;
        if (r > 0) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(inspect_usage, stdout);
            exit(0);
        } else if (!strcmp(argv[i], "--json")) {
            a->json = 1;
        } else if (!strcmp(argv[i], "--ctx")) {
            if (!(v = cli_flag_value(argc, argv, &i, "inspect")) || !cli_parse_int("inspect", "--ctx", v, 1, INT32_MAX, &a->ctx))
                return 0;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "spark inspect: unknown option '%s' (spark inspect --help)\n", argv[i]);
            return 0;
        } else if (!a->path) {
            a->path = argv[i];
        } else {
            fprintf(stderr, "spark inspect: unexpected argument '%s'\n", argv[i]);
            return 0;
        }
    }
    if (!a->path) {
        fprintf(stderr, "spark inspect: MODEL is required (spark inspect --help)\n");
        return 0;
    }
    return 1;
}

int cmd_inspect(int argc, char **argv)
{
    inspect_args a = {0};
    if (!parse_inspect(argc, argv, &a)) return EXIT_USAGE;
    spark_model *m;
    spark_model_load_options lo = spark_model_default_load_options();
    lo.mode = SPARK_LOAD_MMAP; /* metadata only */
    if (spark_model_load_ex(a.path, &lo, &m) != SPARK_OK) return cli_report_error("inspect");
    const spark_model_config *c = spark_model_get_config(m);
    if (!a.ctx) a.ctx = c->max_ctx;
    if (a.ctx > c->max_ctx) {
        fprintf(stderr, "spark inspect: --ctx %ld exceeds the model's maximum of %d positions\n", a.ctx, c->max_ctx);
        spark_model_free(m);
        return EXIT_USAGE;
    }
    if (a.json)
        print_json(m, &a);
    else
        print_text(m, &a);
    spark_model_free(m);
    return 0;
}

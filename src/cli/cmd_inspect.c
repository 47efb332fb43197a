/*
 * cmd_inspect.c — `spark inspect`: what a checkpoint is (hyper-parameters,
 * layer pattern, tensor census by dtype) and what it costs to run (weight
 * bytes per token, KV cache bytes per token and at the maximum context).
 */
#include "cli/cli_util.h"
#include "cli/commands.h"

#include "model/model.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char inspect_usage[] =
    "usage: spark inspect MODEL [--json]\n"
    "\n"
    "Prints the architecture, every hyper-parameter, a tensor census by dtype,\n"
    "bytes of weights, and KV-cache bytes per token and at the maximum context.\n"
    "\n"
    "  --json   one JSON object instead of text\n";

enum { KV_BYTES_PER_VALUE = 4 }; /* the KV cache holds float32 today */

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

typedef struct kv_cost {
    uint64_t per_token;     /* full layers grow by this per position */
    uint64_t sliding_fixed; /* the rings of the sliding layers */
    int n_full, n_sliding;
} kv_cost;

static kv_cost kv_costs(const spark_model_config *c, int64_t n_ctx)
{
    kv_cost k = {0};
    uint64_t row = 2 * (uint64_t)c->n_head_kv * (uint64_t)c->head_dim * KV_BYTES_PER_VALUE;
    for (int i = 0; i < c->n_layer; i++) {
        if (c->layer_kind[i] == SPARK_LAYER_SLIDING) {
            k.n_sliding++;
            k.sliding_fixed += row * (uint64_t)(c->sliding_window < n_ctx ? c->sliding_window : n_ctx);
        } else {
            k.n_full++;
            k.per_token += row;
        }
    }
    return k;
}

static void layer_pattern(const spark_model_config *c, char *out, size_t cap)
{
    size_t n = 0;
    for (int i = 0; i < c->n_layer && n + 1 < cap; i++) out[n++] = c->layer_kind[i] == SPARK_LAYER_SLIDING ? 'S' : 'F';
    out[n] = '\0';
}

static void print_text(const spark_model *m)
{
    const spark_model_config *c = &m->cfg;
    census cs = take_census(m);
    kv_cost kv = kv_costs(c, c->max_ctx);
    char pattern[8192];
    layer_pattern(c, pattern, sizeof pattern);
    printf("model        %s (%s)\n", m->path, m->format == MODEL_FORMAT_GGUF ? "GGUF" : "Hugging Face safetensors");
    printf("architecture spark2_5\n");
    printf("hidden %d, ffn %d, layers %d, heads %d / kv heads %d, head_dim %d, vocab %d\n", c->n_embd, c->n_ff,
           c->n_layer, c->n_head, c->n_head_kv, c->head_dim, c->n_vocab);
    printf("layers       %s  (S = sliding window %d, F = full; %d full, %d sliding)\n", pattern, c->sliding_window,
           kv.n_full, kv.n_sliding);
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
    printf("KV cache (float32)      %llu bytes per token (full layers) + %.3f MB of sliding rings\n",
           (unsigned long long)kv.per_token, kv.sliding_fixed / 1e6);
    printf("KV cache at max context %.3f GB (%d positions)\n",
           ((double)kv.per_token * c->max_ctx + kv.sliding_fixed) / 1e9, c->max_ctx);
}

static void print_json(const spark_model *m)
{
    const spark_model_config *c = &m->cfg;
    census cs = take_census(m);
    kv_cost kv = kv_costs(c, c->max_ctx);
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
    cJSON_AddStringToObject(o, "kv_dtype", "f32");
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)kv.per_token);
    cJSON_AddNumberToObject(o, "kv_bytes_sliding", (double)kv.sliding_fixed);
    cJSON_AddNumberToObject(o, "kv_bytes_max_context", (double)kv.per_token * c->max_ctx + (double)kv.sliding_fixed);
    char *text = cJSON_Print(o);
    if (text) puts(text);
    free(text);
    cJSON_Delete(o);
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(inspect_usage, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "spark inspect: unknown option '%s' (spark inspect --help)\n", argv[i]);
            return EXIT_USAGE;
        } else if (!path) {
            path = argv[i];
        } else {
            fprintf(stderr, "spark inspect: unexpected argument '%s'\n", argv[i]);
            return EXIT_USAGE;
        }
    }
    if (!path) {
        fprintf(stderr, "spark inspect: MODEL is required (spark inspect --help)\n");
        return EXIT_USAGE;
    }
    spark_model *m;
    if (spark_model_load(path, &m) != SPARK_OK) return cli_report_error("inspect");
    if (json)
        print_json(m);
    else
        print_text(m);
    spark_model_free(m);
    return 0;
}

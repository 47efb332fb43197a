/*
 * kv_opts.c — KV-cache flags and the up-front memory check (see kv_opts.h).
 */
#include "cli/kv_opts.h"

#include "cli/cli_util.h"
#include "model/model.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CTX_ROUND = 256 }; /* a lowered default context is a multiple of this */

static const uint64_t MARGIN_MIN = 512ull << 20; /* kept free for the OS, page tables, the rest of us */

void kv_opts_init(kv_opts *o)
{
    o->base = SPARK_KV_F32;
    o->quant = SPARK_KV_F32;
    o->all_layers = 0;
}

static int parse_value(const char *command, const char *flag, const char *v, const char *const *names,
                       const spark_kv_type *types, int n, spark_kv_type *out)
{
    for (int k = 0; k < n; k++)
        if (!strcmp(v, names[k])) {
            *out = types[k];
            return 1;
        }
    fprintf(stderr, "spark %s: %s expects %s", command, flag, names[0]);
    for (int k = 1; k < n; k++) fprintf(stderr, "%s%s", k + 1 < n ? ", " : " or ", names[k]);
    fprintf(stderr, "; got '%s'\n", v);
    return -1;
}

int kv_opts_parse(kv_opts *o, int argc, char **argv, int *i, const char *command)
{
    static const char *const type_names[] = {"f32", "f16", "bf16"};
    static const spark_kv_type type_values[] = {SPARK_KV_F32, SPARK_KV_F16, SPARK_KV_BF16};
    static const char *const bit_names[] = {"off", "2", "3", "3.5", "4"};
    static const spark_kv_type bit_values[] = {SPARK_KV_F32, SPARK_KV_TQ2, SPARK_KV_TQ3, SPARK_KV_TQ3_5, SPARK_KV_TQ4};
    const char *a = argv[*i], *v;
    if (strcmp(a, "--kv-type") && strcmp(a, "--kv-bits") && strcmp(a, "--kv-layers")) return 0;
    if (!(v = cli_flag_value(argc, argv, i, command))) return -1;
    if (!strcmp(a, "--kv-type")) return parse_value(command, a, v, type_names, type_values, 3, &o->base);
    if (!strcmp(a, "--kv-bits")) return parse_value(command, a, v, bit_names, bit_values, 5, &o->quant);
    if (strcmp(v, "full") && strcmp(v, "all")) {
        fprintf(stderr, "spark %s: --kv-layers expects full or all; got '%s'\n", command, v);
        return -1;
    }
    o->all_layers = !strcmp(v, "all");
    return 1;
}

void kv_opts_apply(const kv_opts *o, spark_session_options *so)
{
    int quantized = o->quant != SPARK_KV_F32;
    so->kv_full = quantized ? o->quant : o->base;
    so->kv_sliding = quantized && o->all_layers ? o->quant : o->base;
}

/* ---- memory ----------------------------------------------------------------- */

static double gb(uint64_t bytes) { return (double)bytes / 1e9; }

/* KV bytes of format `t` on the full layers (sliding as in so) at so's context. */
static int kv_bytes_with(const spark_model *m, const spark_session_options *so, spark_kv_type t, uint64_t *bytes)
{
    spark_session_options alt = *so;
    alt.kv_full = t;
    spark_session_memory mem;
    if (spark_session_memory_estimate(m, &alt, &mem) != SPARK_OK) return 0;
    *bytes = mem.kv_bytes;
    return 1;
}

static void print_refusal(const char *command, const spark_model *m, const spark_session_options *so,
                          const spark_session_memory *mem, uint64_t weights, uint64_t avail, uint64_t budget,
                          int64_t fit)
{
    uint64_t need = mem->kv_bytes + mem->scratch_bytes + weights;
    fprintf(stderr,
            "spark %s: a context of %d positions needs %.2f GB: KV cache %.2f GB (%s full layers: %" PRIu64
            " bytes per position; %s sliding rings: %.3f GB) + weights %.2f GB + scratch %.2f GB; only %.2f GB is "
            "available (%.2f GB free now less a %.2f GB margin).\n",
            command, mem->n_ctx, gb(need), gb(mem->kv_bytes), spark_kv_type_name(so->kv_full), mem->kv_per_token,
            spark_kv_type_name(so->kv_sliding), gb(mem->kv_sliding), gb(weights), gb(mem->scratch_bytes), gb(budget),
            gb(avail), gb(avail - budget));
    fprintf(stderr, "spark %s: use", command);
    uint64_t tq4, tq2;
    if (so->kv_full != SPARK_KV_TQ4 && so->kv_full != SPARK_KV_TQ2 && kv_bytes_with(m, so, SPARK_KV_TQ4, &tq4))
        fprintf(stderr, " --kv-bits 4 (KV cache %.2f GB at this context) or", gb(tq4));
    else if (so->kv_full != SPARK_KV_TQ2 && kv_bytes_with(m, so, SPARK_KV_TQ2, &tq2))
        fprintf(stderr, " --kv-bits 2 (KV cache %.2f GB at this context) or", gb(tq2));
    if (fit >= 1)
        fprintf(stderr, " --ctx %" PRId64 " or less (the most that fits with this format).\n", fit);
    else
        fprintf(stderr, " a smaller model: even its weights and scratch do not fit.\n");
}

int kv_check_memory(const char *command, const spark_model *model, spark_session_options *so, int ctx_given,
                    int32_t min_ctx)
{
    spark_session_memory mem;
    if (spark_session_memory_estimate(model, so, &mem) != SPARK_OK) return cli_report_error(command);
    /* on a GPU the cache and scratch live in device memory, allocated (and
     * refused when too large) as the session is created */
    if (so->backend != SPARK_BACKEND_CPU) return 0;
    uint64_t avail = model_memory_available(); /* MemAvailable, or a cgroup limit if lower */
    if (!avail) return 0; /* cannot tell: let the run try */
    uint64_t margin = avail / 20 > MARGIN_MIN ? avail / 20 : MARGIN_MIN;
    uint64_t budget = avail > margin ? avail - margin : 0;
    /* weights read into memory are already out of MemAvailable; mapped ones still have to come in */
    uint64_t weights = spark_model_get_load_info(model)->mode == SPARK_LOAD_COPY ? 0 : spark_model_weight_bytes(model);
    uint64_t need = mem.kv_bytes + mem.scratch_bytes + weights;
    if (need <= budget) return 0;
    /* the context that fits: every position costs its KV rows and a token id */
    uint64_t fixed = weights + mem.kv_sliding + mem.scratch_bytes - 4 * (uint64_t)mem.n_ctx;
    int64_t fit = budget > fixed ? (int64_t)((budget - fixed) / (mem.kv_per_token + 4)) : 0;
    if (fit > mem.n_ctx) fit = mem.n_ctx;
    if (!ctx_given && fit >= CTX_ROUND && fit >= min_ctx) {
        int64_t ctx = fit / CTX_ROUND * CTX_ROUND;
        so->n_ctx = (int32_t)(ctx >= min_ctx ? ctx : fit);
        fprintf(stderr,
                "spark %s: note: context lowered to %d positions to fit in %.2f GB of available memory (the model's "
                "maximum of %d needs %.2f GB); choose with --ctx, or --kv-bits for a smaller cache\n",
                command, so->n_ctx, gb(budget), mem.n_ctx, gb(need));
        return 0;
    }
    print_refusal(command, model, so, &mem, weights, avail, budget, fit);
    return EXIT_RUNTIME;
}

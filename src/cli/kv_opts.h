/*
 * kv_opts.h — the KV-cache options every model-running command shares
 * (--kv-type, --kv-bits, --kv-layers) and the memory check made before a
 * session is created: the cache is committed lazily as the context fills,
 * so without the check a context too large for the machine would fail
 * (or be killed) hours into a run instead of at the start.
 */
#ifndef SPARK_CLI_KV_OPTS_H
#define SPARK_CLI_KV_OPTS_H

#include "spark.h"

typedef struct kv_opts {
    spark_kv_type base;  /* --kv-type: every layer not quantized (default f32) */
    spark_kv_type quant; /* --kv-bits: TurboQuant format; SPARK_KV_F32 = off */
    int all_layers;      /* --kv-layers all: the sliding rings are quantized too */
} kv_opts;

void kv_opts_init(kv_opts *o);

/* Try to consume argv[*i] (and its value). 1 consumed, 0 not ours, -1 bad
 * value (message printed). */
int kv_opts_parse(kv_opts *o, int argc, char **argv, int *i, const char *command);

/* Set the session options' kv_full / kv_sliding from o. */
void kv_opts_apply(const kv_opts *o, spark_session_options *so);

/* Help lines of the options (a literal, so other help texts can embed it). */
#define KV_OPTS_HELP                                                                              \
    "  --kv-type T             KV cache numbers: f32 (default, exact), f16 or bf16\n"             \
    "  --kv-bits B             TurboQuant KV cache: off (default), 2, 3, 3.5 (3-bit keys,\n"     \
    "                          4-bit values) or 4 bits per value\n"                               \
    "  --kv-layers L           layers --kv-bits quantizes: full (default; sliding rings keep\n"  \
    "                          --kv-type) or all\n"

/* Check that a session with *so fits in the memory available now
 * (MemAvailable, and the cgroup limit when there is one, less a margin)
 * next to the model's weights. ctx_given: so->n_ctx came from the user;
 * otherwise (the model's maximum is the default) a context that does not fit
 * is lowered to the largest that does, but not below min_ctx, with a note.
 * Returns 0, or EXIT_RUNTIME after printing the numbers and what to change. */
int kv_check_memory(const char *command, const spark_model *model, spark_session_options *so, int ctx_given,
                    int32_t min_ctx);

#endif

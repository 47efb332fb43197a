/*
 * hook_opts.h — the instrument flags of `spark run` and `spark logits`:
 * steering vectors, residual capture, FFN statistics and phase timing.
 */
#ifndef SPARK_CLI_HOOK_OPTS_H
#define SPARK_CLI_HOOK_OPTS_H

#include "spark.h"

#include <stdio.h>

enum { HOOK_MAX_STEER = 8 };

typedef struct steer_opt {
    const char *file;
    spark_steer_mode mode;
    float strength;
    int32_t first_layer, last_layer; /* -1: every layer the file has */
} steer_opt;

typedef struct hook_opts {
    steer_opt steer[HOOK_MAX_STEER];
    int n_steer;
    const char *capture_file;
    int32_t capture_first, capture_last; /* -1: all layers */
    int capture_all_positions;
    const char *ffn_file;
    long ffn_topk;
    int timing;
} hook_opts;

void hook_opts_init(hook_opts *h);

/* 1 consumed, 0 not ours, -1 bad value (printed). */
int hook_opts_parse(hook_opts *h, int argc, char **argv, int *i, const char *command);

extern const char hook_opts_help[];

/* Load steering files and switch the instruments on; `last_pos` is the
 * absolute position captured by default (the last prompt token). Returns 0
 * or an exit status after printing. */
int hook_opts_apply(const hook_opts *h, spark_model *model, spark_session *session, int32_t last_pos,
                    const char *command);

/* Write the capture / statistics files and print timing. ids: the prompt. */
int hook_opts_finish(const hook_opts *h, const spark_model *model, spark_session *session, const int32_t *ids,
                     int32_t n_ids, const char *command);

/* Print the phase timing summary (host phases; on a GPU session also the
 * wait for the device and the device's own time per phase). */
void hook_opts_print_timing(spark_session *session, FILE *out);

#endif

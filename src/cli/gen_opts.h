/*
 * gen_opts.h — the options `spark run` and `spark chat` share: model,
 * context, threads, sampling (llama.cpp's flag names), stop strings, and the
 * chat switches; plus loading the model, tokenizer, session and sampler they
 * describe.
 */
#ifndef SPARK_CLI_GEN_OPTS_H
#define SPARK_CLI_GEN_OPTS_H

#include "cli/kv_opts.h"
#include "spark.h"

enum { GEN_MAX_STOP = 16 };

/* Which sampling fields the user set (others come from the checkpoint). */
enum {
    SET_TEMP = 1 << 0, SET_TOP_K = 1 << 1, SET_TOP_P = 1 << 2, SET_MIN_P = 1 << 3,
    SET_REPEAT = 1 << 4, SET_PRESENCE = 1 << 5, SET_FREQUENCY = 1 << 6, SET_LAST_N = 1 << 7,
};

typedef struct gen_opts {
    const char *model;
    long n_predict, ctx, threads, batch;
    unsigned long long seed;
    int seed_set;
    spark_sampler_params sp;
    unsigned sp_set;
    const char *stop[GEN_MAX_STOP];
    int n_stop, ignore_eos;
    int chat, no_think, show_think;
    int gpu; /* --gpu / -ngl N (N > 0): run on the CUDA backend */
    int load_mode; /* --mmap / --no-mmap: spark_load_mode (0 = auto) */
    const char *system;
    kv_opts kv; /* --kv-type / --kv-bits / --kv-layers */
} gen_opts;

void gen_opts_init(gen_opts *o, long default_n_predict);

/* Try to consume argv[*i] (and its value) as a shared option.
 * Returns 1 consumed, 0 not ours, -1 bad value (message printed). */
int gen_opts_parse(gen_opts *o, int argc, char **argv, int *i, const char *command);

/* The help text of the shared options. */
extern const char gen_opts_help[];

/* Everything a generation needs, loaded from the options. */
typedef struct gen_env {
    spark_model *model;
    spark_tokenizer *tok;
    spark_session *session;
    spark_sampler *sampler;
    spark_sampler_params sp; /* the settings in force */
} gen_env;

/* Load model + tokenizer (same path), create the session and sampler.
 * Returns 0, or an exit status after printing the error. */
int gen_env_open(gen_env *env, const gen_opts *o, const char *command);
void gen_env_close(gen_env *env);

/* The model path when -m is not given: $SPARK_MODEL, else the embedded
 * default next to the binary (../models/spark-tiny), else ./models/spark-tiny. */
const char *gen_default_model(void);

#endif

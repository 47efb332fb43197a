/*
 * gen_opts.c — parsing and applying the options shared by `spark run` and
 * `spark chat`.
 */
#include "cli/gen_opts.h"

#include "cli/cli_util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char gen_opts_help[] =
    "  -m, --model PATH        HF directory or GGUF file (default: $SPARK_MODEL, else the\n"
    "                          embedded models/spark-tiny)\n"
    "  -n, --n-predict N       tokens to generate (-1: until EOS or the context is full)\n"
    "  -c, --ctx N             context length (default: the model's maximum)\n"
    "  -t, --threads N         CPU threads (default: all cores)\n"
    "  -b, --batch N           prompt tokens per forward chunk (default 512)\n"
    KV_OPTS_HELP
    "  --gpu                   run on the GPU (CUDA; -ngl N with N > 0 is accepted too)\n"
    "  --no-mmap               read the weights into memory (huge pages): fastest CPU decode; the default\n"
    "                          on the CPU when the files fit in available memory with a quarter to spare\n"
    "  --mmap                  memory-map the weights instead (no copy; the default with --gpu or when\n"
    "                          memory is short)\n"
    "  -s, --seed N            random seed (default: from the clock; printed)\n"
    "  --temp T                temperature; 0 = greedy (default: generation_config, else 1.0)\n"
    "  --top-k K               keep the K most likely tokens (0 = off)\n"
    "  --top-p P               nucleus sampling mass in (0, 1] (1 = off)\n"
    "  --min-p P               drop tokens below P x the top probability (0 = off)\n"
    "  --repeat-penalty R      divide repeated tokens' positive logits by R (1 = off)\n"
    "  --repeat-last-n N       window of tokens the penalties look at (default 64, -1 = all)\n"
    "  --presence-penalty X    subtract X from tokens already present (0 = off)\n"
    "  --frequency-penalty X   subtract X times the count of each present token (0 = off)\n"
    "  --stop STR              stop when STR is generated (repeatable, up to 16)\n"
    "  --ignore-eos            keep generating past the end-of-sequence token\n"
    "  --chat                  wrap the prompt in the Spark chat format\n"
    "  --system TEXT           system message for --chat\n"
    "  --no-think              chat without the thinking phase\n"
    "  --show-think            print the model's reasoning (dimmed on a terminal)\n";

void gen_opts_init(gen_opts *o, long default_n_predict)
{
    memset(o, 0, sizeof *o);
    o->n_predict = default_n_predict;
    o->sp = spark_sampler_default_params();
    kv_opts_init(&o->kv);
}

static int float_opt(const char *command, const char *flag, const char *v, double lo, double hi, float *out)
{
    double x;
    if (!cli_parse_float(command, flag, v, &x)) return -1;
    if (x < lo || x > hi) {
        fprintf(stderr, "spark %s: %s must be in [%g, %g], got %s\n", command, flag, lo, hi, v);
        return -1;
    }
    *out = (float)x;
    return 1;
}

static int int_opt(const char *command, const char *flag, const char *v, long lo, long hi, long *out)
{
    return cli_parse_int(command, flag, v, lo, hi, out) ? 1 : -1;
}

static int sampling_opt(gen_opts *o, const char *a, const char *v, const char *cmd)
{
    long n;
    int r;
    spark_sampler_params *sp = &o->sp;
    if (!strcmp(a, "--temp")) {
        o->sp_set |= SET_TEMP;
        return float_opt(cmd, a, v, 0, 1e6, &sp->temperature);
    }
    if (!strcmp(a, "--top-p")) {
        o->sp_set |= SET_TOP_P;
        r = float_opt(cmd, a, v, 0, 1, &sp->top_p);
        if (r == 1 && sp->top_p == 0) {
            fprintf(stderr, "spark %s: --top-p must be > 0\n", cmd);
            return -1;
        }
        return r;
    }
    if (!strcmp(a, "--min-p")) {
        o->sp_set |= SET_MIN_P;
        return float_opt(cmd, a, v, 0, 1, &sp->min_p);
    }
    if (!strcmp(a, "--repeat-penalty")) {
        o->sp_set |= SET_REPEAT;
        r = float_opt(cmd, a, v, 1e-6, 1e6, &sp->repeat_penalty);
        return r;
    }
    if (!strcmp(a, "--presence-penalty")) {
        o->sp_set |= SET_PRESENCE;
        return float_opt(cmd, a, v, -1e6, 1e6, &sp->presence_penalty);
    }
    if (!strcmp(a, "--frequency-penalty")) {
        o->sp_set |= SET_FREQUENCY;
        return float_opt(cmd, a, v, -1e6, 1e6, &sp->frequency_penalty);
    }
    if (!strcmp(a, "--top-k")) {
        o->sp_set |= SET_TOP_K;
        if ((r = int_opt(cmd, a, v, 0, INT_MAX, &n)) == 1) sp->top_k = (int32_t)n;
        return r;
    }
    if (!strcmp(a, "--repeat-last-n")) {
        o->sp_set |= SET_LAST_N;
        if ((r = int_opt(cmd, a, v, -1, INT_MAX, &n)) == 1) sp->penalty_last_n = (int32_t)n;
        return r;
    }
    return 0;
}

static int valued_opt(gen_opts *o, const char *a, const char *v, const char *cmd)
{
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        o->model = v;
        return 1;
    }
    if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) return int_opt(cmd, a, v, -1, INT_MAX, &o->n_predict);
    if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) return int_opt(cmd, a, v, 1, INT_MAX, &o->ctx);
    if (!strcmp(a, "-t") || !strcmp(a, "--threads")) return int_opt(cmd, a, v, 1, 4096, &o->threads);
    if (!strcmp(a, "-b") || !strcmp(a, "--batch")) return int_opt(cmd, a, v, 1, 1 << 20, &o->batch);
    if (!strcmp(a, "-s") || !strcmp(a, "--seed")) {
        char *end;
        if (*v == '-' || !*v || (o->seed = strtoull(v, &end, 10), *end)) {
            fprintf(stderr, "spark %s: %s expects a non-negative integer, got '%s'\n", cmd, a, v);
            return -1;
        }
        o->seed_set = 1;
        return 1;
    }
    if (!strcmp(a, "--system")) {
        o->system = v;
        return 1;
    }
    if (!strcmp(a, "--stop")) {
        if (o->n_stop == GEN_MAX_STOP || !*v) {
            fprintf(stderr, "spark %s: --stop: at most %d non-empty strings\n", cmd, GEN_MAX_STOP);
            return -1;
        }
        o->stop[o->n_stop++] = v;
        return 1;
    }
    return sampling_opt(o, a, v, cmd);
}

int gen_opts_parse(gen_opts *o, int argc, char **argv, int *i, const char *command)
{
    const char *a = argv[*i];
    int kv = kv_opts_parse(&o->kv, argc, argv, i, command);
    if (kv) return kv;
    if (!strcmp(a, "--chat")) return o->chat = 1;
    if (!strcmp(a, "--no-think")) return o->no_think = 1;
    if (!strcmp(a, "--show-think")) return o->show_think = 1;
    if (!strcmp(a, "--ignore-eos")) return o->ignore_eos = 1;
    if (!strcmp(a, "--gpu")) return o->gpu = 1;
    if (cli_load_flag(a, &o->load_mode)) return 1;
    if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers")) { /* llama.cpp spelling: all layers or none */
        const char *v = cli_flag_value(argc, argv, i, command);
        long n;
        if (!v || !cli_parse_int(command, a, v, 0, INT_MAX, &n)) return -1;
        o->gpu = n > 0;
        return 1;
    }
    static const char *const valued[] = {"-m", "--model", "-n", "--n-predict", "-c", "--ctx", "-t", "--threads",
                                         "-b", "--batch", "-s", "--seed", "--system", "--stop", "--temp",
                                         "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n",
                                         "--presence-penalty", "--frequency-penalty", NULL};
    for (int k = 0; valued[k]; k++) {
        if (strcmp(a, valued[k])) continue;
        const char *v = cli_flag_value(argc, argv, i, command);
        return v ? valued_opt(o, a, v, command) : -1;
    }
    return 0;
}

const char *gen_default_model(void)
{
    static char path[PATH_MAX];
    const char *env = getenv("SPARK_MODEL");
    if (env && *env) return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        snprintf(path, sizeof path, "%s/../models/spark-tiny", exe);
        if (access(path, F_OK) == 0) return path;
    }
    return "models/spark-tiny";
}

/* User-set fields win over the checkpoint's recommendations. */
static spark_sampler_params merge_sampling(const gen_opts *o, spark_sampler_params model_defaults)
{
    spark_sampler_params p = model_defaults;
    const spark_sampler_params *u = &o->sp;
    if (o->sp_set & SET_TEMP) p.temperature = u->temperature;
    if (o->sp_set & SET_TOP_K) p.top_k = u->top_k;
    if (o->sp_set & SET_TOP_P) p.top_p = u->top_p;
    if (o->sp_set & SET_MIN_P) p.min_p = u->min_p;
    if (o->sp_set & SET_REPEAT) p.repeat_penalty = u->repeat_penalty;
    if (o->sp_set & SET_PRESENCE) p.presence_penalty = u->presence_penalty;
    if (o->sp_set & SET_FREQUENCY) p.frequency_penalty = u->frequency_penalty;
    if (o->sp_set & SET_LAST_N) p.penalty_last_n = u->penalty_last_n;
    p.seed = o->seed_set ? o->seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    return p;
}

int gen_env_open(gen_env *env, const gen_opts *o, const char *command)
{
    memset(env, 0, sizeof *env);
    const char *path = o->model ? o->model : gen_default_model();
    if (cli_load_model(path, o->load_mode, o->gpu, &env->model) != SPARK_OK) return cli_report_error(command);
    if (spark_tokenizer_load(path, &env->tok) != SPARK_OK) return cli_report_error(command);
    spark_session_options so = spark_session_default_options();
    so.n_ctx = (int32_t)o->ctx;
    so.n_batch = (int32_t)o->batch;
    so.n_threads = (int32_t)o->threads;
    so.backend = o->gpu ? SPARK_BACKEND_CUDA : SPARK_BACKEND_CPU;
    kv_opts_apply(&o->kv, &so);
    if (kv_check_memory(command, env->model, &so, o->ctx > 0, 1)) return EXIT_RUNTIME;
    if (spark_session_create(env->model, &so, &env->session) != SPARK_OK) return cli_report_error(command);
    env->sp = merge_sampling(o, spark_model_sampler_defaults(env->model));
    int32_t vocab = spark_model_get_config(env->model)->n_vocab;
    if (spark_sampler_create(&env->sp, vocab, &env->sampler) != SPARK_OK) return cli_report_error(command);
    return 0;
}

void gen_env_close(gen_env *env)
{
    spark_sampler_free(env->sampler);
    spark_session_free(env->session);
    spark_tokenizer_free(env->tok);
    spark_model_free(env->model);
    memset(env, 0, sizeof *env);
}

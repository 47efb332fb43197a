/*
 * cmd_logits.c — `spark logits`: raw logits for a list of token ids, written
 * as a NumPy .npy file; the C side of every numerical test.
 */
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/hook_opts.h"
#include "cli/kv_opts.h"

#include "spark.h"
#include "io/npy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char logits_usage[] =
    "usage: spark logits MODEL --ids ID,ID,... --out FILE.npy [options]\n"
    "\n"
    "Evaluates the ids from position 0 and writes float32 raw logits (pre-softmax).\n"
    "\n"
    "  --ids LIST          comma-separated token ids\n"
    "  --out FILE          output .npy: shape [n_ids, vocab] with --all, else [1, vocab]\n"
    "  --all               logits for every position, not only the last\n"
    "  --mode MODE         prefill (default): the ids in batches of --batch tokens;\n"
    "                      decode: one token at a time through the KV cache\n"
    "  --batch N           tokens per prefill chunk (default 512)\n"
    "  --ctx N             context length (default: the model's maximum)\n"
    "  -t, --threads N     CPU threads (default: all cores)\n"
    "  --gpu               run on the GPU (CUDA; -ngl N with N > 0 too)\n"
    KV_OPTS_HELP;

typedef struct logits_args {
    const char *model, *out, *ids_text;
    int all, decode, gpu, load_mode;
    long batch, ctx, threads;
    hook_opts hooks;
    kv_opts kv;
} logits_args;

static int parse_logits_args(int argc, char **argv, logits_args *a)
{
    static const char cmd[] = "logits";
    hook_opts_init(&a->hooks);
    kv_opts_init(&a->kv);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v;
        int r = hook_opts_parse(&a->hooks, argc, argv, &i, cmd);
        if (r == 0) r = kv_opts_parse(&a->kv, argc, argv, &i, cmd);
        if (r < 0) return 0;
        if (r > 0) continue;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            printf("%s%s%s", logits_usage, cli_load_help, hook_opts_help);
            exit(0);
        } else if (cli_load_flag(arg, &a->load_mode)) {
        } else if (!strcmp(arg, "--all")) {
            a->all = 1;
        } else if (!strcmp(arg, "--gpu")) {
            a->gpu = 1;
        } else if (!strcmp(arg, "-ngl") || !strcmp(arg, "--n-gpu-layers")) {
            long ngl;
            if (!(v = cli_flag_value(argc, argv, &i, cmd)) || !cli_parse_int(cmd, arg, v, 0, INT32_MAX, &ngl)) return 0;
            a->gpu = ngl > 0;
        } else if (!strcmp(arg, "--ids")) {
            if (!(a->ids_text = cli_flag_value(argc, argv, &i, cmd))) return 0;
        } else if (!strcmp(arg, "--out")) {
            if (!(a->out = cli_flag_value(argc, argv, &i, cmd))) return 0;
        } else if (!strcmp(arg, "--mode")) {
            if (!(v = cli_flag_value(argc, argv, &i, cmd))) return 0;
            if (strcmp(v, "prefill") && strcmp(v, "decode")) {
                fprintf(stderr, "spark logits: --mode expects prefill or decode, got '%s'\n", v);
                return 0;
            }
            a->decode = !strcmp(v, "decode");
        } else if (!strcmp(arg, "--batch")) {
            if (!(v = cli_flag_value(argc, argv, &i, cmd)) || !cli_parse_int(cmd, arg, v, 1, 1 << 20, &a->batch))
                return 0;
        } else if (!strcmp(arg, "--ctx")) {
            if (!(v = cli_flag_value(argc, argv, &i, cmd)) || !cli_parse_int(cmd, arg, v, 1, INT32_MAX, &a->ctx))
                return 0;
        } else if (!strcmp(arg, "-t") || !strcmp(arg, "--threads")) {
            if (!(v = cli_flag_value(argc, argv, &i, cmd)) || !cli_parse_int(cmd, arg, v, 1, 4096, &a->threads))
                return 0;
        } else if (arg[0] == '-') {
            fprintf(stderr, "spark logits: unknown option '%s' (spark logits --help)\n", arg);
            return 0;
        } else if (!a->model) {
            a->model = arg;
        } else {
            fprintf(stderr, "spark logits: unexpected argument '%s'\n", arg);
            return 0;
        }
    }
    if (!a->model || !a->ids_text || !a->out) {
        fprintf(stderr, "spark logits: MODEL, --ids and --out are required (spark logits --help)\n");
        return 0;
    }
    return 1;
}

/* Evaluate ids through the session as asked; rows = 1 or n. */
static spark_status eval_ids(spark_session *s, const logits_args *a, const int32_t *ids, int n, float *logits,
                             size_t vocab)
{
    if (!a->decode) return spark_session_eval(s, ids, n, logits, a->all);
    for (int t = 0; t < n; t++) {
        int want = a->all || t == n - 1;
        float *row = want ? logits + (a->all ? (size_t)t * vocab : 0) : NULL;
        spark_status st = spark_session_eval(s, ids + t, 1, row, 0);
        if (st != SPARK_OK) return st;
    }
    return SPARK_OK;
}

int cmd_logits(int argc, char **argv)
{
    logits_args a = {0};
    if (!parse_logits_args(argc, argv, &a)) return EXIT_USAGE;
    int32_t *ids;
    int n;
    if (!cli_parse_ids("logits", a.ids_text, &ids, &n)) return EXIT_USAGE;

    spark_model *model = NULL;
    spark_session *session = NULL;
    float *logits = NULL;
    int rc = EXIT_RUNTIME;
    if (cli_load_model(a.model, a.load_mode, a.gpu, &model) != SPARK_OK) goto fail;
    spark_session_options o = spark_session_default_options();
    o.n_ctx = (int32_t)a.ctx;
    o.n_batch = (int32_t)a.batch;
    o.n_threads = (int32_t)a.threads;
    o.backend = a.gpu ? SPARK_BACKEND_CUDA : SPARK_BACKEND_CPU;
    kv_opts_apply(&a.kv, &o);
    if ((rc = kv_check_memory("logits", model, &o, a.ctx > 0, n)) != 0) goto done;
    rc = EXIT_RUNTIME;
    if (spark_session_create(model, &o, &session) != SPARK_OK) goto fail;
    size_t vocab = (size_t)spark_model_get_config(model)->n_vocab;
    size_t rows = a.all ? (size_t)n : 1;
    logits = malloc(rows * vocab * sizeof(float));
    if (!logits) {
        fprintf(stderr, "spark logits: out of memory for %zu x %zu logits\n", rows, vocab);
        goto done;
    }
    if ((rc = hook_opts_apply(&a.hooks, model, session, n - 1, "logits")) != 0) goto done;
    rc = EXIT_RUNTIME;
    if (eval_ids(session, &a, ids, n, logits, vocab) != SPARK_OK) goto fail;
    if ((rc = hook_opts_finish(&a.hooks, model, session, ids, n, "logits")) != 0) goto done;
    rc = EXIT_RUNTIME;
    int64_t shape[2] = {(int64_t)rows, (int64_t)vocab};
    if (npy_write_f32(a.out, logits, shape, 2) != SPARK_OK) goto fail;
    rc = 0;
    goto done;
fail:
    rc = cli_report_error("logits");
done:
    free(logits);
    free(ids);
    spark_session_free(session);
    spark_model_free(model);
    return rc;
}

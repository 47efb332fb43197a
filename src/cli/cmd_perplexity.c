/*
 * cmd_perplexity.c — `spark perplexity`: teacher-forced perplexity of a text.
 *
 * The text is tokenized as one string (no BOS) and cut into windows of --ctx
 * tokens starting every --stride tokens; each window runs alone from
 * position 0. The first window scores every position after its first token;
 * later windows score only the positions the previous window did not
 * (stride = ctx: non-overlapping windows, every position t >= 1 scored).
 * nll = logsumexp(logits[t-1]) - logits[t-1][ids[t]], in double.
 */
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/kv_opts.h"

#include "spark.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char ppl_usage[] =
    "usage: spark perplexity MODEL --file TEXT [options]\n"
    "\n"
    "  --file FILE     UTF-8 text to score\n"
    "  --ctx N         window length in tokens (default 512)\n"
    "  --stride S      distance between window starts (default: ctx, no overlap)\n"
    "  --chunks K      score only the first K windows\n"
    "  --json          print one JSON object\n"
    "  -t N            CPU threads\n"
    "  --gpu           run on the GPU (CUDA; -ngl N with N > 0 too)\n"
    KV_OPTS_HELP;

typedef struct ppl_args {
    const char *model, *file;
    long ctx, stride, chunks, threads, ngl;
    int json, gpu, load_mode;
    kv_opts kv;
} ppl_args;

static int parse_ppl(int argc, char **argv, ppl_args *a)
{
    static const char cmd[] = "perplexity";
    a->ctx = 512;
    kv_opts_init(&a->kv);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v;
        long *num = NULL, lo = 1;
        int kv = kv_opts_parse(&a->kv, argc, argv, &i, cmd);
        if (kv < 0) return 0;
        if (kv > 0) continue;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            printf("%s%s", ppl_usage, cli_load_help);
            exit(0);
        } else if (!strcmp(arg, "--json")) {
            a->json = 1;
            continue;
        } else if (!strcmp(arg, "--gpu")) {
            a->gpu = 1;
            continue;
        } else if (cli_load_flag(arg, &a->load_mode)) {
            continue;
        } else if (!strcmp(arg, "-ngl") || !strcmp(arg, "--n-gpu-layers")) {
            num = &a->ngl, lo = 0;
        } else if (!strcmp(arg, "--file")) {
            if (!(a->file = cli_flag_value(argc, argv, &i, cmd))) return 0;
            continue;
        } else if (!strcmp(arg, "--ctx")) {
            num = &a->ctx, lo = 2;
        } else if (!strcmp(arg, "--stride")) {
            num = &a->stride;
        } else if (!strcmp(arg, "--chunks")) {
            num = &a->chunks;
        } else if (!strcmp(arg, "-t") || !strcmp(arg, "--threads")) {
            num = &a->threads;
        } else if (arg[0] != '-' && !a->model) {
            a->model = arg;
            continue;
        } else {
            fprintf(stderr, "spark %s: unexpected argument '%s' (spark %s --help)\n", cmd, arg, cmd);
            return 0;
        }
        if (!(v = cli_flag_value(argc, argv, &i, cmd)) || !cli_parse_int(cmd, arg, v, lo, INT32_MAX, num)) return 0;
    }
    if (!a->model || !a->file) {
        fprintf(stderr, "spark perplexity: MODEL and --file are required (spark perplexity --help)\n");
        return 0;
    }
    if (a->ngl > 0) a->gpu = 1;
    if (!a->stride) a->stride = a->ctx;
    if (a->stride > a->ctx) {
        fprintf(stderr, "spark perplexity: --stride %ld exceeds --ctx %ld\n", a->stride, a->ctx);
        return 0;
    }
    return 1;
}

enum { ROWS_PER_EVAL = 64 }; /* logits are taken this many positions at a time */

/* Score window ids[0..len) from position `first` on; adds to *nll, returns count. */
static int score_window(spark_session *s, const int32_t *ids, int len, int first, int32_t vocab, float *logits,
                        double *nll)
{
    int scored = 0;
    spark_session_reset(s);
    for (int at = 0; at < len - 1; at += ROWS_PER_EVAL) {
        int n = len - 1 - at < ROWS_PER_EVAL ? len - 1 - at : ROWS_PER_EVAL;
        if (spark_session_eval(s, ids + at, n, logits, 1) != SPARK_OK) return -1;
        for (int r = 0; r < n; r++) {
            int t = at + r + 1; /* the token predicted by row r */
            if (t < first) continue;
            const float *row = logits + (size_t)r * vocab;
            double max = row[0], sum = 0;
            for (int32_t v = 1; v < vocab; v++) max = row[v] > max ? row[v] : max;
            for (int32_t v = 0; v < vocab; v++) sum += exp(row[v] - max);
            *nll += max + log(sum) - row[ids[t]];
            scored++;
        }
    }
    return scored;
}

static void progress(int done, int total)
{
    if (!isatty(STDERR_FILENO)) return;
    int width = 30, filled = total ? width * done / total : width;
    fprintf(stderr, "\r\033[2Kperplexity [");
    for (int i = 0; i < width; i++) fputc(i < filled ? '#' : '.', stderr);
    fprintf(stderr, "] %d/%d windows", done, total);
    if (done == total) fprintf(stderr, "\r\033[2K");
}

int cmd_perplexity(int argc, char **argv)
{
    ppl_args a = {0};
    if (!parse_ppl(argc, argv, &a)) return EXIT_USAGE;
    FILE *f = fopen(a.file, "rb");
    size_t len = 0;
    char *text = f ? cli_read_all(f, &len) : NULL;
    if (f) fclose(f);
    if (!text) {
        fprintf(stderr, "spark perplexity: cannot read %s\n", a.file);
        return EXIT_RUNTIME;
    }
    spark_model *model = NULL;
    spark_tokenizer *tok = NULL;
    spark_session *s = NULL;
    spark_token_buf ids = {0};
    float *logits = NULL;
    int rc = EXIT_RUNTIME;
    spark_session_options o = spark_session_default_options();
    o.n_ctx = (int32_t)a.ctx;
    o.n_threads = (int32_t)a.threads;
    o.backend = a.gpu ? SPARK_BACKEND_CUDA : SPARK_BACKEND_CPU;
    kv_opts_apply(&a.kv, &o);
    if (cli_load_model(a.model, a.load_mode, a.gpu, &model) != SPARK_OK || spark_tokenizer_load(a.model, &tok) != SPARK_OK ||
        spark_tokenizer_encode(tok, text, len, SPARK_ENCODE_PARSE_SPECIAL, &ids) != SPARK_OK) {
        rc = cli_report_error("perplexity");
        goto done;
    }
    if ((rc = kv_check_memory("perplexity", model, &o, 1, 0)) != 0) goto done;
    if (spark_session_create(model, &o, &s) != SPARK_OK) {
        rc = cli_report_error("perplexity");
        goto done;
    }
    rc = EXIT_RUNTIME;
    int32_t vocab = spark_model_get_config(model)->n_vocab;
    logits = malloc((size_t)ROWS_PER_EVAL * vocab * sizeof(float));
    int total = 0;
    for (size_t w = 0; w + 1 < ids.n; w += (size_t)a.stride) total++;
    if (a.chunks && a.chunks < total) total = (int)a.chunks;
    if (!logits || total == 0) {
        fprintf(stderr, "spark perplexity: %s: %s\n", a.file, logits ? "fewer than 2 tokens" : "out of memory");
        goto done;
    }
    double nll = 0;
    long scored = 0;
    for (int k = 0; k < total; k++) {
        size_t start = (size_t)k * (size_t)a.stride;
        int wlen = ids.n - start < (size_t)a.ctx ? (int)(ids.n - start) : (int)a.ctx;
        int first = k == 0 ? 1 : (int)(a.ctx - a.stride) > 1 ? (int)(a.ctx - a.stride) : 1;
        int got = score_window(s, ids.ids + start, wlen, first, vocab, logits, &nll);
        if (got < 0) {
            rc = cli_report_error("perplexity");
            goto done;
        }
        scored += got;
        progress(k + 1, total);
    }
    double ppl = exp(nll / (double)scored);
    if (a.json)
        printf("{\"ppl\": %.10g, \"mean_nll\": %.10g, \"scored\": %ld, \"windows\": %d, \"tokens\": %zu, \"ctx\": %ld, "
               "\"stride\": %ld}\n", ppl, nll / (double)scored, scored, total, ids.n, a.ctx, a.stride);
    else
        printf("perplexity %.4f over %ld scored tokens (%d windows of %ld, stride %ld; %zu tokens)\n", ppl, scored,
               total, a.ctx, a.stride, ids.n);
    rc = 0;
done:
    free(logits);
    free(text);
    spark_token_buf_free(&ids);
    spark_session_free(s);
    spark_tokenizer_free(tok);
    spark_model_free(model);
    return rc;
}

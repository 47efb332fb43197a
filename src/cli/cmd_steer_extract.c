/*
 * cmd_steer_extract.c — `spark steer-extract`: a steering direction per
 * layer from two prompt sets, the difference of the mean residual streams
 * at each prompt's last token. Its .npy output is what --steer reads, so
 * capture -> direction -> steer works end to end.
 */
#include "cli/cli_util.h"
#include "cli/commands.h"

#include "io/npy.h"
#include "spark.h"

#include <stdlib.h>
#include <string.h>

static const char extract_usage[] =
    "usage: spark steer-extract MODEL --positive FILE --negative FILE --out DIR.npy [options]\n"
    "\n"
    "Each non-empty line of FILE is one prompt. Writes float32 [layers, hidden]:\n"
    "mean(residual | positive) - mean(residual | negative) at each prompt's last token,\n"
    "after every layer; use it with spark run --steer DIR.npy.\n"
    "\n"
    "  --layers A-B    keep only layers A..B (others are zero rows = not steered)\n"
    "  -t N            CPU threads\n";

typedef struct extract_args {
    const char *model, *pos, *neg, *out;
    long first, last, threads;
} extract_args;

static int parse_extract(int argc, char **argv, extract_args *a)
{
    static const char cmd[] = "steer-extract";
    a->first = a->last = -1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], **slot = NULL, *v;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            fputs(extract_usage, stdout);
            exit(0);
        }
        if (!strcmp(arg, "--positive")) slot = &a->pos;
        else if (!strcmp(arg, "--negative")) slot = &a->neg;
        else if (!strcmp(arg, "--out")) slot = &a->out;
        if (slot) {
            if (!(*slot = cli_flag_value(argc, argv, &i, cmd))) return 0;
        } else if (!strcmp(arg, "--layers")) {
            if (!(v = cli_flag_value(argc, argv, &i, cmd))) return 0;
            char *end;
            a->first = strtol(v, &end, 10);
            a->last = *end == '-' ? strtol(end + 1, &end, 10) : a->first;
            if (*end || a->first < 0 || a->last < a->first) {
                fprintf(stderr, "spark %s: --layers expects A-B, got '%s'\n", cmd, v);
                return 0;
            }
        } else if (!strcmp(arg, "-t")) {
            if (!(v = cli_flag_value(argc, argv, &i, cmd)) || !cli_parse_int(cmd, arg, v, 1, 4096, &a->threads))
                return 0;
        } else if (arg[0] == '-' || a->model) {
            fprintf(stderr, "spark %s: unexpected argument '%s' (spark %s --help)\n", cmd, arg, cmd);
            return 0;
        } else {
            a->model = arg;
        }
    }
    if (!a->model || !a->pos || !a->neg || !a->out) {
        fprintf(stderr, "spark %s: MODEL, --positive, --negative and --out are required\n", cmd);
        return 0;
    }
    return 1;
}

/* Add the last-token residual of every line of `path` into sum; returns the
 * number of prompts, or -1 after printing an error. */
static int accumulate(spark_session *s, const spark_tokenizer *tok, const spark_model_config *c, const char *path,
                      double *sum)
{
    FILE *f = fopen(path, "rb");
    size_t len;
    char *text = f ? cli_read_all(f, &len) : NULL;
    if (f) fclose(f);
    if (!text) {
        fprintf(stderr, "spark steer-extract: cannot read %s\n", path);
        return -1;
    }
    int count = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        spark_token_buf ids = {0};
        if (!*line || spark_tokenizer_encode(tok, line, strlen(line), SPARK_ENCODE_PARSE_SPECIAL, &ids) != SPARK_OK ||
            ids.n == 0) {
            spark_token_buf_free(&ids);
            continue;
        }
        spark_session_reset(s);
        spark_status st = spark_session_capture_start(s, 0, c->n_layer - 1, 0, (int32_t)ids.n - 1);
        if (st == SPARK_OK) st = spark_session_eval(s, ids.ids, (int32_t)ids.n, NULL, 0);
        spark_token_buf_free(&ids);
        if (st != SPARK_OK || spark_session_capture_count(s) != 1) {
            fprintf(stderr, "spark steer-extract: %s: %s\n", path, spark_last_error());
            free(text);
            return -1;
        }
        const float *rows = spark_session_capture_data(s);
        for (size_t i = 0; i < (size_t)c->n_layer * c->n_embd; i++) sum[i] += rows[i];
        count++;
    }
    free(text);
    if (!count) fprintf(stderr, "spark steer-extract: %s has no prompts\n", path);
    return count ? count : -1;
}

int cmd_steer_extract(int argc, char **argv)
{
    extract_args a = {0};
    if (!parse_extract(argc, argv, &a)) return EXIT_USAGE;
    spark_model *model = NULL;
    spark_tokenizer *tok = NULL;
    spark_session *s = NULL;
    int rc = EXIT_RUNTIME;
    if (spark_model_load(a.model, &model) != SPARK_OK || spark_tokenizer_load(a.model, &tok) != SPARK_OK)
        return cli_report_error("steer-extract");
    const spark_model_config *c = spark_model_get_config(model);
    spark_session_options o = spark_session_default_options();
    o.n_threads = (int32_t)a.threads;
    o.n_ctx = c->max_ctx < 8192 ? c->max_ctx : 8192;
    size_t n = (size_t)c->n_layer * c->n_embd;
    double *pos = calloc(n, sizeof *pos), *neg = calloc(n, sizeof *neg);
    float *dir = calloc(n, sizeof *dir);
    int n_pos, n_neg;
    if (!pos || !neg || !dir || spark_session_create(model, &o, &s) != SPARK_OK) {
        rc = cli_report_error("steer-extract");
    } else if ((n_pos = accumulate(s, tok, c, a.pos, pos)) > 0 && (n_neg = accumulate(s, tok, c, a.neg, neg)) > 0) {
        for (int32_t l = 0; l < c->n_layer; l++) {
            if (a.first >= 0 && (l < a.first || l > a.last)) continue;
            for (int32_t k = 0; k < c->n_embd; k++) {
                size_t i = (size_t)l * c->n_embd + k;
                dir[i] = (float)(pos[i] / n_pos - neg[i] / n_neg);
            }
        }
        int64_t shape[2] = {c->n_layer, c->n_embd};
        rc = npy_write_f32(a.out, dir, shape, 2) == SPARK_OK ? 0 : cli_report_error("steer-extract");
        if (rc == 0) fprintf(stderr, "wrote %s from %d positive and %d negative prompts\n", a.out, n_pos, n_neg);
    }
    free(pos);
    free(neg);
    free(dir);
    spark_session_free(s);
    spark_tokenizer_free(tok);
    spark_model_free(model);
    return rc;
}

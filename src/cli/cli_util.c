/*
 * cli_util.c — argument parsing and output helpers for the CLI.
 */
#include "cli/cli_util.h"

#include "spark.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *cli_flag_value(int argc, char **argv, int *i, const char *command)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "spark %s: %s needs a value\n", command, argv[*i]);
        return NULL;
    }
    *i += 1;
    return argv[*i];
}

int cli_parse_int(const char *command, const char *flag, const char *text, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max) {
        fprintf(stderr, "spark %s: %s expects an integer in [%ld, %ld], got '%s'\n", command, flag, min, max, text);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_parse_float(const char *command, const char *flag, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v)) {
        fprintf(stderr, "spark %s: %s expects a finite number, got '%s'\n", command, flag, text);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_parse_ids(const char *command, const char *text, int32_t **ids, int *n)
{
    size_t cap = 1;
    for (const char *p = text; *p; p++) cap += *p == ',';
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) {
        fprintf(stderr, "spark %s: out of memory\n", command);
        return 0;
    }
    int count = 0;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        long id = strtol(p, &end, 10);
        if (errno || end == p || id < 0 || id > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "spark %s: --ids expects comma-separated non-negative integers, got '%s'\n", command,
                    text);
            free(v);
            return 0;
        }
        v[count++] = (int32_t)id;
        p = *end ? end + 1 : end;
    }
    if (count == 0) {
        fprintf(stderr, "spark %s: --ids is empty\n", command);
        free(v);
        return 0;
    }
    *ids = v;
    *n = count;
    return 1;
}

const char cli_load_help[] =
    "  --no-mmap               read the weights into memory (huge pages): fastest CPU decode; the default\n"
    "                          on the CPU when the files fit in available memory with a quarter to spare\n"
    "  --mmap                  memory-map the weights instead (no copy; the default on the GPU or when\n"
    "                          memory is short)\n";

int cli_load_flag(const char *arg, int *mode)
{
    if (!strcmp(arg, "--mmap")) return *mode = SPARK_LOAD_MMAP, 1;
    if (!strcmp(arg, "--no-mmap")) return *mode = SPARK_LOAD_COPY, 1;
    return 0;
}

typedef struct load_progress {
    double last;
    int shown;
} load_progress;

static void show_progress(uint64_t done, uint64_t total, void *user)
{
    load_progress *p = user;
    double frac = total ? (double)done / (double)total : 1.0;
    if (frac - p->last < 0.01 && done < total) return;
    p->last = frac;
    p->shown = 1;
    fprintf(stderr, "\rreading weights into memory: %3.0f%% (%.2f of %.2f GB)", 100.0 * frac, (double)done / 1e9,
            (double)total / 1e9);
    fflush(stderr);
}

int cli_load_model(const char *path, int mode, int gpu, spark_model **out)
{
    spark_model_load_options lo = spark_model_default_load_options();
    lo.mode = (spark_load_mode)mode;
    if (lo.mode == SPARK_LOAD_AUTO && gpu) lo.mode = SPARK_LOAD_MMAP; /* the weights go to the device */
    load_progress p = {0};
    if (isatty(2)) lo.progress = show_progress, lo.progress_user = &p;
    int st = spark_model_load_ex(path, &lo, out);
    if (p.shown) fprintf(stderr, "\r\033[K");
    return st;
}

int cli_report_error(const char *command)
{
    fprintf(stderr, "spark %s: %s\n", command, spark_last_error());
    return EXIT_RUNTIME;
}

char *cli_read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (ferror(f)) break;
        if (feof(f)) {
            buf[n] = '\0';
            *len = n;
            return buf;
        }
        if (n + 1 >= cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) break;
            buf = grown;
        }
    }
    free(buf);
    return NULL;
}

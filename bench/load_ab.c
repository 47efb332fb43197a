/*
 * load_ab.c — A/B of the two ways to hold weights (mapped vs read into
 * memory), interleaved so that a shared machine's noise hits both alike.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o /tmp/load_ab bench/load_ab.c \
 *      build/libspark.a -lpcre2-8 -lcjson -lmicrohttpd -lm -lpthread -fopenmp
 *   /tmp/load_ab MODEL [rounds] [tokens per round] [threads]   (defaults 6 16 2)
 *
 * Loads MODEL twice (SPARK_LOAD_MMAP and SPARK_LOAD_COPY; the page cache is
 * shared, so the RAM cost is one copy), then alternates rounds of
 * single-token decode steps on each, and prints tokens/s per round and the
 * median of each.
 */
#include "spark.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 2) return fprintf(stderr, "usage: load_ab MODEL [rounds] [tokens] [threads]\n"), 2;
    int rounds = argc > 2 ? atoi(argv[2]) : 6, n = argc > 3 ? atoi(argv[3]) : 16, th = argc > 4 ? atoi(argv[4]) : 2;
    spark_model *m[2];
    spark_session *s[2];
    static const char *const names[2] = {"mmap", "copy"};
    for (int k = 0; k < 2; k++) {
        spark_model_load_options lo = spark_model_default_load_options();
        lo.mode = k ? SPARK_LOAD_COPY : SPARK_LOAD_MMAP;
        if (spark_model_load_ex(argv[1], &lo, &m[k]) != SPARK_OK) return fprintf(stderr, "%s\n", spark_last_error()), 1;
        const spark_model_load_info *li = spark_model_get_load_info(m[k]);
        printf("%s: %s, %.1f s\n", names[k], li->why, li->seconds);
        spark_session_options so = spark_session_default_options();
        so.n_ctx = n + 1;
        so.n_threads = th;
        if (spark_session_create(m[k], &so, &s[k]) != SPARK_OK) return fprintf(stderr, "%s\n", spark_last_error()), 1;
    }
    int32_t vocab = spark_model_get_config(m[0])->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    double *rate[2] = {malloc(sizeof(double) * (size_t)rounds), malloc(sizeof(double) * (size_t)rounds)};
    for (int r = -1; r < rounds; r++) /* round -1 warms both up */
        for (int k = 0; k < 2; k++) {
            int kk = r & 1 ? 1 - k : k; /* alternate which goes first */
            spark_session_reset(s[kk]);
            double t0 = now_s();
            for (int i = 0; i < n; i++) {
                int32_t id = (int32_t)((i * 7919 + 13) % vocab);
                if (spark_session_eval(s[kk], &id, 1, logits, 0) != SPARK_OK) return fprintf(stderr, "%s\n", spark_last_error()), 1;
            }
            double t = now_s() - t0;
            if (r >= 0) rate[kk][r] = n / t;
        }
    for (int k = 0; k < 2; k++) {
        printf("%s:", names[k]);
        for (int r = 0; r < rounds; r++) printf(" %.2f", rate[k][r]);
        qsort(rate[k], (size_t)rounds, sizeof(double), cmp);
        printf("   median %.3f tok/s\n", rate[k][rounds / 2]);
    }
    for (int k = 0; k < 2; k++) {
        spark_session_free(s[k]);
        spark_model_free(m[k]);
    }
    return 0;
}

/*
 * decode_ab.c — decode speed of two CPU backend settings in ONE process,
 * tokens alternating between them, so that a shared machine's drift (on the
 * development VM the same binary decodes at 5-13 t/s within minutes) hits
 * both alike. One model load (read into memory, THP, as spark bench does);
 * two sessions, each created while one environment setting is in force
 * (the CPU backend reads SPARK_GEMV_LANES, SPARK_GEMV_NEXT, ... when a
 * session makes it).
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o /tmp/decode_ab bench/decode_ab.c build/libspark.a \
 *      -lpcre2-8 -lcjson -lmicrohttpd -lm -lpthread -fopenmp
 *   (a build with nvcc also needs -L/usr/local/cuda/lib64 -lcublas -lcudart -lstdc++)
 *   /tmp/decode_ab MODEL "A_VAR=value" "B_VAR=value" [rounds] [tokens] [threads]   (defaults 8 16 2)
 *
 * A round decodes `tokens` tokens from position 0 (random ids) on A and then
 * on B (the order flipped every round); prints each round's tok/s and the
 * median over rounds of B's time / A's (> 1: B is slower).
 */
#include "spark.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int set_env(const char *kv, int on)
{
    const char *eq = strchr(kv, '=');
    if (!eq) return 0;
    char name[128];
    size_t n = (size_t)(eq - kv) < sizeof name - 1 ? (size_t)(eq - kv) : sizeof name - 1;
    memcpy(name, kv, n);
    name[n] = '\0';
    if (on) setenv(name, eq + 1, 1);
    else unsetenv(name);
    return 1;
}

static double decode(spark_session *s, const int32_t *ids, int n, float *logits)
{
    spark_session_reset(s);
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        if (spark_session_eval(s, ids + i, 1, logits, 0) != SPARK_OK) return -1;
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: decode_ab MODEL A_VAR=value B_VAR=value [rounds] [tokens] [threads]\n");
        return 2;
    }
    int rounds = argc > 4 ? atoi(argv[4]) : 8, tokens = argc > 5 ? atoi(argv[5]) : 16;
    int threads = argc > 6 ? atoi(argv[6]) : 2;
    if (rounds < 1 || rounds > 256 || tokens < 1) return 2;
    spark_model_load_options lo = {.mode = SPARK_LOAD_COPY};
    spark_model *m;
    if (spark_model_load_ex(argv[1], &lo, &m) != SPARK_OK) {
        fprintf(stderr, "decode_ab: cannot load %s: %s\n", argv[1], spark_last_error());
        return 1;
    }
    spark_session_options so = spark_session_default_options();
    so.n_ctx = 4096;
    so.n_threads = threads;
    spark_session *s[2];
    for (int k = 0; k < 2; k++) {
        if (!set_env(argv[2 + k], 1)) return 2;
        spark_status st = spark_session_create(m, &so, &s[k]);
        set_env(argv[2 + k], 0);
        if (st != SPARK_OK) return 1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)tokens);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < tokens; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % 100000);
    }
    float *logits = malloc(sizeof(float) * 262144);
    decode(s[0], ids, tokens, logits); /* warm-up: pages, caches */
    decode(s[1], ids, tokens, logits);
    double ratio[256], ta[256], tb[256];
    for (int r = 0; r < rounds; r++) {
        double t[2];
        for (int q = 0; q < 2; q++) {
            int k = (q + r) % 2;
            t[k] = decode(s[k], ids, tokens, logits);
        }
        ta[r] = tokens / t[0];
        tb[r] = tokens / t[1];
        ratio[r] = t[1] / t[0];
        printf("round %d: A %.3f t/s, B %.3f t/s, B/A time %.3f\n", r + 1, ta[r], tb[r], ratio[r]);
        fflush(stdout);
    }
    for (int a = 0; a < rounds; a++)
        for (int b = a + 1; b < rounds; b++) {
            if (ratio[b] < ratio[a]) {
                double t = ratio[a];
                ratio[a] = ratio[b];
                ratio[b] = t;
            }
            if (ta[b] < ta[a]) {
                double t = ta[a];
                ta[a] = ta[b];
                ta[b] = t;
            }
            if (tb[b] < tb[a]) {
                double t = tb[a];
                tb[a] = tb[b];
                tb[b] = t;
            }
        }
    printf("A (%s): %.3f-%.3f t/s, median %.3f\nB (%s): %.3f-%.3f t/s, median %.3f\n"
           "B/A time: median %.3f, range %.3f-%.3f over %d rounds of %d tokens\n",
           argv[2], ta[0], ta[rounds - 1], ta[rounds / 2], argv[3], tb[0], tb[rounds - 1], tb[rounds / 2],
           ratio[rounds / 2], ratio[0], ratio[rounds - 1], rounds, tokens);
    for (int k = 0; k < 2; k++) spark_session_free(s[k]);
    spark_model_free(m);
    free(ids);
    free(logits);
    return 0;
}

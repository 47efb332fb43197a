/*
 * flash_bench.c — prefill timing of the CUDA backend at several prompt
 * lengths in one process (one model upload), and the time and TFLOP/s of the
 * prefill attention kernel (cuda_flash.cu) itself.
 *
 *   flash_bench MODEL --ctx N P1 [P2 ...]
 *
 * For each prompt length P: a fresh session state (reset), P pseudo-random
 * ids prefilled in the default chunks of 512 (last-row logits), timed; then
 * the same again with the attention launches bracketed by events (each one
 * waited for: a little slower overall) to report the attention's share and
 * its useful TFLOP/s (4 * head_dim per query head and visible key). Needs
 * the CUDA build (cu_flash_timing lives in cuda_flash.cu).
 */
#include "spark.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void cu_flash_timing(int on, double *ms, double *flop, long *calls);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "flash_bench: %s: %s\n", what, spark_last_error());
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 5 || strcmp(argv[2], "--ctx")) {
        fprintf(stderr, "usage: flash_bench MODEL --ctx N P1 [P2 ...]\n");
        return 2;
    }
    long ctx = atol(argv[3]);
    spark_model *model;
    if (spark_model_load(argv[1], &model) != SPARK_OK) die("load");
    const spark_model_config *c = spark_model_get_config(model);
    spark_session_options o = spark_session_default_options();
    o.n_ctx = (int32_t)ctx;
    o.backend = SPARK_BACKEND_CUDA;
    spark_session *s;
    double t0 = now();
    if (spark_session_create(model, &o, &s) != SPARK_OK) die("session");
    printf("session ctx %ld: %.2f s\n", ctx, now() - t0);
    int32_t *ids = malloc((size_t)ctx * sizeof(int32_t));
    float *logits = malloc((size_t)c->n_vocab * sizeof(float));
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    for (long i = 0; i < ctx; i++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        ids[i] = 3 + (int32_t)((rng >> 33) % (uint64_t)(c->n_vocab - 3));
    }
    if (spark_session_eval(s, ids, 64, logits, 0) != SPARK_OK) die("warm-up");
    for (int k = 4; k < argc; k++) {
        long p = atol(argv[k]);
        if (p < 1 || p > ctx) die("prompt length");
        for (int timed = p >= 65536; timed < 2; timed++) { /* the longest prompts only once, timed */
            spark_session_reset(s);
            cu_flash_timing(timed, NULL, NULL, NULL);
            double a = now();
            if (spark_session_eval(s, ids, (int32_t)p, logits, 0) != SPARK_OK) die("prefill");
            double t = now() - a;
            double ms, flop;
            long calls;
            cu_flash_timing(0, &ms, &flop, &calls);
            if (!timed)
                printf("prefill %ld tokens: %.3f s, %.0f tok/s\n", p, t, p / t);
            else
                printf("prefill %ld tokens, attention timed: %.3f s, %.0f tok/s; flash attention: %ld launches, %.3f s = %.1f%% of the prefill, "
                       "%.3g useful FLOP, %.1f TFLOP/s useful (x3 on tensor cores: %.1f)\n",
                       p, t, p / t, calls, ms / 1e3, 100.0 * ms / 1e3 / t, flop, ms > 0 ? flop / (ms / 1e3) / 1e12 : 0.0,
                       ms > 0 ? 3 * flop / (ms / 1e3) / 1e12 : 0.0);
            fflush(stdout);
        }
    }
    free(ids);
    free(logits);
    spark_session_free(s);
    spark_model_free(model);
    return 0;
}

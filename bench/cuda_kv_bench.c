/*
 * cuda_kv_bench.c — issue 7's scale table on a GPU: for one KV-cache format,
 * the device-memory accounting (bytes a session needs, the largest context
 * that fits) and batch-1 decode speed at given depths.
 *
 *   cuda_kv_bench MODEL --kv f32|f16|bf16|tq2|tq3|tq3.5|tq4 [--depths 32768,131072,1048576]
 *                 [--decode 32] [--ctx N]
 *
 * f32 / f16 / bf16 apply to every layer (as --kv-type); tq* to the full
 * layers, the sliding rings staying f32 (as --kv-bits). One session of
 * context N (default: the largest depth + decode + 16) is created — which
 * also checks that a context of that size really fits — then for each depth
 * the session is placed at that position with its cache rows [0, depth)
 * filled with synthetic rows (session_bench_fill: seeded pseudo-random
 * vectors / codes in the format; not a prefill: decode cost depends only on
 * how many rows attention reads) and `decode` single-token steps are timed
 * (logits copied back each step, as in generation).
 * Bytes read per step: every weight once + the KV rows attention reads (full
 * layers: depth rows, sliding: the window) in the cache's row size.
 * Uses engine-internal functions (engine/session.h): build with -Isrc.
 */
#include "spark.h"

#include "engine/kv_format.h"
#include "engine/session.h"
#include "backend/cuda/cuda_backend.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "cuda_kv_bench: %s: %s\n", what, spark_last_error());
    exit(1);
}

/* KV bytes one decode step at position pos reads. */
static double kv_read(const spark_model_config *c, const spark_session_options *o, int64_t pos)
{
    double total = 0;
    for (int i = 0; i < c->n_layer; i++) {
        int sl = c->layer_kind[i] == SPARK_LAYER_SLIDING;
        spark_kv_type t = sl ? o->kv_sliding : o->kv_full;
        int64_t keys = pos + 1;
        if (sl && keys > c->sliding_window) keys = c->sliding_window;
        total += (double)keys * c->n_head_kv * (double)(kv_row_bytes(t, 0, c->head_dim) + kv_row_bytes(t, 1, c->head_dim));
    }
    return total;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *kv = "f16", *depths_s = "32768,131072,1048576";
    long decode = 32, ctx = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kv") && i + 1 < argc) kv = argv[++i];
        else if (!strcmp(argv[i], "--depths") && i + 1 < argc) depths_s = argv[++i];
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc) decode = atol(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atol(argv[++i]);
        else if (!path) path = argv[i];
        else {
            fprintf(stderr, "usage: cuda_kv_bench MODEL --kv FMT [--depths A,B,..] [--decode D] [--ctx N]\n");
            return 2;
        }
    }
    spark_kv_type t = SPARK_KV_TYPE_COUNT;
    for (int k = 0; k < SPARK_KV_TYPE_COUNT; k++)
        if (!strcmp(kv, spark_kv_type_name((spark_kv_type)k))) t = (spark_kv_type)k;
    if (!path || t == SPARK_KV_TYPE_COUNT || decode < 1) {
        fprintf(stderr, "usage: cuda_kv_bench MODEL --kv f32|f16|bf16|tq2|tq3|tq3.5|tq4 [--depths ..] [--decode D]\n");
        return 2;
    }
    long depths[16];
    int nd = 0;
    for (char *p = (char *)depths_s; *p && nd < 16;) {
        depths[nd++] = strtol(p, &p, 10);
        if (*p == ',') p++;
    }
    long maxd = 0;
    for (int i = 0; i < nd; i++) maxd = depths[i] > maxd ? depths[i] : maxd;

    spark_model *model;
    if (spark_model_load(path, &model) != SPARK_OK) die("load");
    const spark_model_config *c = spark_model_get_config(model);
    spark_session_options o = spark_session_default_options();
    o.backend = SPARK_BACKEND_CUDA;
    o.kv_full = t;
    o.kv_sliding = kv_tq_bits(t, 0) ? SPARK_KV_F32 : t;
    o.n_ctx = (int32_t)(ctx ? ctx : maxd + decode + 16);
    if (o.n_ctx > c->max_ctx) o.n_ctx = c->max_ctx;

    /* the accounting: bytes needed at this context, the largest that fits */
    uint64_t free_b, total_b, need, margin;
    char name[128];
    if (backend_cuda_memory(0, &free_b, &total_b, name, sizeof name) != SPARK_OK) die("device");
    int64_t fit;
    if (session_device_fit(model, &o, free_b, total_b, &need, &margin, &fit) != SPARK_OK) die("fit");
    spark_session_memory mem;
    if (spark_session_memory_estimate(model, &o, &mem) != SPARK_OK) die("estimate");
    printf("FIT kv=%s sliding=%s device=\"%s\" free_gb=%.2f total_gb=%.2f kv_per_token=%llu ctx=%d need_gb=%.2f "
           "largest_ctx=%lld (model max %d)\n",
           spark_kv_type_name(o.kv_full), spark_kv_type_name(o.kv_sliding), name, free_b / 1e9, total_b / 1e9,
           (unsigned long long)mem.kv_per_token, o.n_ctx, need / 1e9, (long long)fit, c->max_ctx);
    fflush(stdout);

    double t0 = now();
    spark_session *s;
    if (spark_session_create(model, &o, &s) != SPARK_OK) die("session");
    uint64_t f2, t2;
    char n2[8];
    backend_cuda_memory(0, &f2, &t2, n2, sizeof n2);
    printf("SESSION kv=%s ctx=%d created in %.2f s; device free after: %.2f GB\n", spark_kv_type_name(t), o.n_ctx,
           now() - t0, f2 / 1e9);
    fflush(stdout);

    float *logits = malloc((size_t)c->n_vocab * sizeof(float));
    double wbytes = (double)spark_model_weight_bytes(model);
    for (int di = 0; di < nd; di++) {
        long depth = depths[di];
        if (depth + decode + 4 > o.n_ctx) {
            printf("DEPTH %ld: skipped (context %d)\n", depth, o.n_ctx);
            continue;
        }
        double a = now();
        if (session_bench_fill(s, (int32_t)depth, 0x5eed + (uint64_t)depth) != SPARK_OK) die("fill");
        double t_fill = now() - a;
        int32_t id = 5;
        for (int w = 0; w < 3; w++)
            if (spark_session_eval(s, &id, 1, logits, 0) != SPARK_OK) die("warm-up");
        a = now();
        for (long i = 0; i < decode; i++) {
            id = 3 + (int32_t)((i * 7919) % (c->n_vocab - 3));
            if (spark_session_eval(s, &id, 1, logits, 0) != SPARK_OK) die("decode");
        }
        double step = (now() - a) / (double)decode;
        double kvb = kv_read(c, &o, depth + 3 + decode / 2);
        printf("RESULT kv=%s depth=%ld decode_tok_s=%.2f ms_per_token=%.4f weights_gb=%.3f kv_gb=%.3f tb_s=%.3f "
               "fill_s=%.2f finite=%d\n",
               spark_kv_type_name(t), depth, 1.0 / step, step * 1e3, wbytes / 1e9, kvb / 1e9, (wbytes + kvb) / step / 1e12,
               t_fill, logits[0] == logits[0] && logits[c->n_vocab - 1] == logits[c->n_vocab - 1]);
        fflush(stdout);
    }
    free(logits);
    spark_session_free(s);
    spark_model_free(model);
    return 0;
}

/*
 * decode_replay.c — the 4B decode's matrix products alone, as the backend
 * runs them, against the bandwidth probe in the same process.
 *
 *   make build/libspark.a   (or BUILD=... NVCC= for a CPU-only library)
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o /tmp/decode_replay bench/decode_replay.c \
 *      build/libspark.a -lpcre2-8 -lcjson -lmicrohttpd -lm -lpthread -fopenmp
 *   (a build with nvcc also needs -L/usr/local/cuda/lib64 -lcublas -lcudart -lstdc++)
 *   /tmp/decode_replay [threads] [passes] [q8_0|bf16]     (defaults 2 8 q8_0)
 *
 * One 2 MiB-aligned buffer with transparent huge pages asked for (as the
 * loader's copy of the weights) holds the 36 layers' matrices in the order
 * a token uses them (qkv, gate, out, ffn_gate, ffn_up, ffn_down) and the
 * tied head; a pass runs those 217 products for one token through the
 * backend's matmul, nothing else. Two backends, one made with
 * SPARK_GEMV_LANES=8 and one with =2, alternate pass by pass (the order
 * flipped every round), so the machine's drift hits both layouts alike;
 * each pass is also set against a pass of the probe's loop over the same
 * bytes in the same round (one contiguous half a thread, per matrix).
 * Prints per layout the median GB/s and the median ratio to that loop,
 * and cpu_probe_bandwidth (a fresh 1 GiB buffer, as spark bench's floor)
 * before and after.
 */
#include "backend/cpu/probe.h"
#include "backend/cpu/threadpool.h"
#include "engine/backend.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { E = 2560, FF = 10240, QKV = 6144, HEADS = 16, QD = 4096, LAYERS = 36, VOCAB = 131072, PER_LAYER = 6,
       MAX_PASSES = 64 };

/* the probe's loop (probe.c) on one matrix: each thread sums a contiguous half */
typedef struct stream_job {
    const weight_ref *w;
    size_t bytes;
    float sink[64];
} stream_job;

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static float sum512(const uint8_t *p, size_t n)
{
    __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        for (int k = 0; k < 4; k++) _mm_prefetch((const char *)p + i + 1024 + 64 * k, _MM_HINT_T0);
        a = _mm512_add_ps(a, _mm512_loadu_ps((const float *)(p + i)));
        b = _mm512_add_ps(b, _mm512_loadu_ps((const float *)(p + i + 64)));
        c = _mm512_add_ps(c, _mm512_loadu_ps((const float *)(p + i + 128)));
        d = _mm512_add_ps(d, _mm512_loadu_ps((const float *)(p + i + 192)));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}
#endif

static float sum_plain(const uint8_t *p, size_t n)
{
    float acc[16] = {0};
    for (size_t i = 0; i + 64 <= n; i += 64)
        for (int k = 0; k < 16; k++) acc[k] += ((const float *)(p + i))[k];
    float s = 0;
    for (int k = 0; k < 16; k++) s += acc[k];
    return s;
}

static void stream_task(void *arg, int ith, int nth)
{
    stream_job *j = arg;
    size_t lo = j->bytes * (size_t)ith / (size_t)nth / 256 * 256;
    size_t hi = ith == nth - 1 ? j->bytes : j->bytes * (size_t)(ith + 1) / (size_t)nth / 256 * 256;
    const uint8_t *p = (const uint8_t *)j->w->data + lo;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) {
        j->sink[ith % 64] += sum512(p, hi - lo);
        return;
    }
#endif
    j->sink[ith % 64] += sum_plain(p, hi - lo);
}

static double median(double *v, int n)
{
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            if (v[b] < v[a]) {
                double t = v[a];
                v[a] = v[b];
                v[b] = t;
            }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2, passes = argc > 2 ? atoi(argv[2]) : 8;
    if (passes < 1) passes = 1;
    if (passes > MAX_PASSES) passes = MAX_PASSES;
    spark_dtype dt = SPARK_DTYPE_Q8_0;
    if (argc > 3 && !strcmp(argv[3], "bf16")) dt = SPARK_DTYPE_BF16;
    static const int64_t shape[PER_LAYER][2] = {{QKV, E}, {HEADS, E}, {E, QD}, {FF, E}, {FF, E}, {E, FF}};
    int nmat = LAYERS * PER_LAYER + 1;
    weight_ref *w = calloc((size_t)nmat, sizeof *w);
    size_t total = 0;
    for (int i = 0; i < nmat; i++) {
        int64_t r = i < LAYERS * PER_LAYER ? shape[i % PER_LAYER][0] : VOCAB;
        int64_t c = i < LAYERS * PER_LAYER ? shape[i % PER_LAYER][1] : E;
        w[i] = (weight_ref){.name = "w", .dtype = dt, .rows = r, .cols = c};
        total += ((size_t)dtype_row_bytes(dt, (uint64_t)c) * (size_t)r + 63) & ~(size_t)63;
    }
    const size_t huge = (size_t)2 << 20;
    uint8_t *region = mmap(NULL, total + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) return 1;
    uint8_t *buf = (uint8_t *)(((uintptr_t)region + huge - 1) & ~(uintptr_t)(huge - 1));
    madvise(buf, total, MADV_HUGEPAGE);
    /* bytes that are sane numbers: f16 scale 2^-10-ish for Q8_0, small bf16 values */
    for (size_t i = 0; i < total; i++) buf[i] = (uint8_t)((i * 2654435761u) >> 13);
    if (dt == SPARK_DTYPE_Q8_0)
        for (size_t b = 0; b + 34 <= total; b += 34) buf[b] = 0, buf[b + 1] = 0x14;
    else
        for (size_t i = 1; i < total; i += 2) buf[i] = 0x3c;
    size_t off = 0;
    for (int i = 0; i < nmat; i++) {
        w[i].data = buf + off;
        off += ((size_t)dtype_row_bytes(dt, (uint64_t)w[i].cols) * (size_t)w[i].rows + 63) & ~(size_t)63;
    }
    backend *be[2];
    static const char *names[2] = {"8 lanes", "2 lanes"};
    for (int k = 0; k < 2; k++) {
        setenv("SPARK_GEMV_LANES", k ? "2" : "8", 1);
        if (backend_cpu_create(threads, &be[k]) != SPARK_OK) return 1;
    }
    unsetenv("SPARK_GEMV_LANES");
    thread_pool *pool;
    if (pool_create(threads, &pool) != SPARK_OK) return 1;
    float *x = malloc(sizeof(float) * FF), *y = malloc(sizeof(float) * VOCAB);
    for (int i = 0; i < FF; i++) x[i] = (float)((i * 37) % 101 - 50) * 0.01f;
    double bw0 = 0, bw1 = 0, gbs[3][MAX_PASSES], ratio[2][MAX_PASSES];
    cpu_probe_bandwidth(threads, (size_t)1 << 30, 3, &bw0);
    for (int p = 0; p < passes + 1; p++) { /* round 0 warms up */
        double t[3];
        for (int q = 0; q < 3; q++) {
            int v = (q + p) % 3; /* 0, 1: the layouts; 2: the probe's loop */
            double t0 = now_s();
            for (int i = 0; i < nmat; i++) {
                if (v < 2) {
                    be[v]->ops->matmul(be[v], y, x, &w[i], 1);
                } else {
                    stream_job j = {.w = &w[i], .bytes = (size_t)dtype_row_bytes(dt, (uint64_t)w[i].cols) * (size_t)w[i].rows};
                    pool_run(pool, stream_task, &j, threads);
                }
            }
            t[v] = now_s() - t0;
        }
        if (p == 0) continue;
        for (int v = 0; v < 3; v++) gbs[v][p - 1] = (double)total / t[v] / 1e9;
        for (int v = 0; v < 2; v++) ratio[v][p - 1] = t[2] / t[v];
        if (getenv("REPLAY_VERBOSE"))
            fprintf(stderr, "round %d: 8 lanes %.2f, 2 lanes %.2f, loop %.2f GB/s\n", p, gbs[0][p - 1], gbs[1][p - 1],
                    gbs[2][p - 1]);
    }
    cpu_probe_bandwidth(threads, (size_t)1 << 30, 3, &bw1);
    double lo[3], hi[3];
    for (int v = 0; v < 3; v++) {
        lo[v] = hi[v] = gbs[v][0];
        for (int p = 1; p < passes; p++) {
            if (gbs[v][p] < lo[v]) lo[v] = gbs[v][p];
            if (gbs[v][p] > hi[v]) hi[v] = gbs[v][p];
        }
    }
    printf("%s, %d threads, %d rounds; probe (fresh 1 GiB) %.2f before, %.2f after\n", dtype_name(dt), threads, passes,
           bw0, bw1);
    for (int v = 0; v < 2; v++)
        printf("  %s: products %.2f GB/s median (%.2f-%.2f), %.3f of the loop on the same bytes (median)\n", names[v],
               median(gbs[v], passes), lo[v], hi[v], median(ratio[v], passes));
    printf("  the probe's loop on the weights: %.2f GB/s median (%.2f-%.2f)\n", median(gbs[2], passes), lo[2], hi[2]);
    for (int k = 0; k < 2; k++) be[k]->ops->destroy(be[k]);
    pool_free(pool);
    return 0;
}

/*
 * kernel_bench.c — the CPU matrix-product kernels one at a time, per weight
 * format: GEMV (one token, decode) and GEMM (many tokens, prefill).
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o /tmp/kernel_bench bench/kernel_bench.c \
 *      build/libspark.a -lpcre2-8 -lcjson -lmicrohttpd -lm -lpthread -fopenmp
 *   (a build with nvcc also needs -L/usr/local/cuda/lib64 -lcublas -lcudart -lstdc++)
 *   /tmp/kernel_bench [threads] [tokens] [rows] [cols]      (defaults 1 1 128 2560)
 *
 * Small matrices (rows <= 2048) are timed in cache with the thread's CPU
 * time (robust on a shared machine): that is the kernel's compute rate.
 * Larger ones rotate through 8 matrices (far beyond the caches), timed by
 * the wall clock next to the bandwidth probe: that is the streaming rate and
 * its share of the floor. SPARK_CPU=scalar|avx2|avx512 picks the level.
 */
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/probe.h"
#include "engine/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double seconds(int wall)
{
    struct timespec t;
    clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Random bytes with sane f16 block scales (or plain values) in `dt`. */
static uint8_t *make_weights(spark_dtype dt, size_t bytes)
{
    uint8_t *m = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) m[i] = (uint8_t)((i * 2654435761u) >> 13);
    int be = dtype_block_elems(dt), bb = dtype_block_bytes(dt);
    if (dt == SPARK_DTYPE_F32)
        for (size_t i = 0; i < bytes / 4; i++) ((float *)m)[i] = 0.01f;
    else if (be == 1)
        for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)m)[i] = 0x1400; /* small in f16 and bf16 */
    else
        for (size_t b = 0; b < bytes / (size_t)bb; b++) {
            uint8_t *p = m + b * (size_t)bb + (dt == SPARK_DTYPE_Q6_K ? 208 : 0);
            p[0] = 0, p[1] = 0x14;
            if (dt == SPARK_DTYPE_Q4_K) p[2] = 0, p[3] = 0x14;
        }
    return m;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1, n = argc > 2 ? atoi(argv[2]) : 1;
    int64_t rows = argc > 3 ? atol(argv[3]) : 128, cols = argc > 4 ? atol(argv[4]) : 2560;
    int big = rows > 2048, nmat = big ? 8 : 1;
    static const spark_dtype dts[] = {SPARK_DTYPE_F32, SPARK_DTYPE_BF16, SPARK_DTYPE_F16, SPARK_DTYPE_Q8_0,
                                      SPARK_DTYPE_Q4_0, SPARK_DTYPE_Q4_K, SPARK_DTYPE_Q6_K};
    backend *be;
    if (backend_cpu_create(threads, &be) != SPARK_OK) return 1;
    float *x = malloc(sizeof(float) * (size_t)(cols * n)), *y = malloc(sizeof(float) * (size_t)(rows * n));
    for (int64_t i = 0; i < cols * n; i++) x[i] = (float)(i % 7) * 0.1f;
    printf("level %s, %d threads, %d tokens, [%lld x %lld]%s\n", cpu_isa_name(cpu_isa_active()), threads, n,
           (long long)rows, (long long)cols, big ? " x 8 matrices, streamed" : ", in cache");
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        spark_dtype dt = dts[d];
        size_t bytes = (size_t)dtype_row_bytes(dt, (uint64_t)cols) * (size_t)rows;
        uint8_t *m = make_weights(dt, bytes * (size_t)nmat);
        double best = 1e30, bw = 0;
        for (int rep = 0; rep < (big ? 5 : 200); rep++) {
            double t0 = seconds(big);
            for (int k = 0; k < nmat; k++) {
                weight_ref w = {.name = "w", .dtype = dt, .rows = rows, .cols = cols, .data = m + (size_t)k * bytes};
                be->ops->matmul(be, y, x, &w, n);
            }
            double t = (seconds(big) - t0) / nmat;
            best = t < best ? t : best;
        }
        if (big) cpu_probe_bandwidth(threads, (size_t)256 << 20, 3, &bw);
        printf("%-5s %9.3f ms  %7.1f GB/s  %7.1f GFLOP/s", dtype_name(dt), best * 1e3, (double)bytes / best / 1e9,
               2.0 * (double)rows * (double)cols * n / best / 1e9);
        if (big) printf("   probe %5.1f GB/s  %3.0f%% of it", bw, 100.0 * (double)bytes / best / 1e9 / bw);
        printf("\n");
        free(m);
    }
    be->ops->destroy(be);
    free(x);
    free(y);
    return 0;
}

/*
 * probe.c — the bandwidth and FMA-peak probes behind `spark bench`.
 *
 * Bandwidth: each thread sums its own contiguous slice with four vector
 * accumulators (enough to keep loads in flight; the adds are free next to
 * DRAM), the way the GEMV kernels stream weights, in three prefetch forms
 * (below): the fastest pass counts. FMA peak: each thread
 * runs NACC independent multiply-add chains (latency x ports of a modern
 * core is at most ~10), so the loop is bound by FMA throughput alone.
 * Both run on the same thread pool as the kernels.
 */
#include "backend/cpu/probe.h"

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/threadpool.h"
#include "base/error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- streaming read ------------------------------------------------------------ */

/* The loop in CPU_PROBE_FORMS forms, the software prefetch being the only
 * difference: 1 KB ahead to L1 (the form every earlier figure used, tuned
 * on the Intel VM), 4 KB ahead to L2, none (the hardware prefetchers
 * alone), and 4 KB ahead non-temporal (what the 2-lane GEMVs do since
 * 2026-12-02). On the Zen 5 VM the second and third read 11-13 % faster
 * than the first (bench/RESULTS.md, 2026-12-01, "Prefetches to L2"); a
 * probe must be the best plain read these threads manage, so every
 * measurement takes the fastest of them, including any form the kernels
 * use. */

#if defined(__x86_64__)
#define PROBE_SUM512(NAME, PF, HINT)                                                                    \
    __attribute__((target("avx512f"))) static float NAME(const float *p, size_t n)                     \
    {                                                                                                  \
        __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;                                           \
        for (size_t i = 0; i + 64 <= n; i += 64) {                                                     \
            if (PF)                                                                                    \
                for (int k = 0; k < 4; k++) _mm_prefetch((const char *)(p + i) + (PF) + 64 * k, HINT); \
            a = _mm512_add_ps(a, _mm512_load_ps(p + i));                                               \
            b = _mm512_add_ps(b, _mm512_load_ps(p + i + 16));                                          \
            c = _mm512_add_ps(c, _mm512_load_ps(p + i + 32));                                          \
            d = _mm512_add_ps(d, _mm512_load_ps(p + i + 48));                                          \
        }                                                                                              \
        return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));          \
    }
PROBE_SUM512(sum512_l1, 1024, _MM_HINT_T0)
PROBE_SUM512(sum512_l2, 4096, _MM_HINT_T1)
PROBE_SUM512(sum512_hw, 0, _MM_HINT_T0)
PROBE_SUM512(sum512_nt, 4096, _MM_HINT_NTA)

#define PROBE_SUM256(NAME, PF, HINT)                                                                    \
    __attribute__((target("avx2"))) static float NAME(const float *p, size_t n)                        \
    {                                                                                                  \
        __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;                                           \
        for (size_t i = 0; i + 32 <= n; i += 32) {                                                     \
            if (PF)                                                                                    \
                for (int k = 0; k < 2; k++) _mm_prefetch((const char *)(p + i) + (PF) + 64 * k, HINT); \
            a = _mm256_add_ps(a, _mm256_load_ps(p + i));                                               \
            b = _mm256_add_ps(b, _mm256_load_ps(p + i + 8));                                           \
            c = _mm256_add_ps(c, _mm256_load_ps(p + i + 16));                                          \
            d = _mm256_add_ps(d, _mm256_load_ps(p + i + 24));                                          \
        }                                                                                              \
        float t[8];                                                                                    \
        _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));                  \
        return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];                                  \
    }
PROBE_SUM256(sum256_l1, 1024, _MM_HINT_T0)
PROBE_SUM256(sum256_l2, 4096, _MM_HINT_T1)
PROBE_SUM256(sum256_hw, 0, _MM_HINT_T0)
PROBE_SUM256(sum256_nt, 4096, _MM_HINT_NTA)
#endif

static float sum_plain(const float *p, size_t n)
{
    float acc[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += p[i + k];
    return acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
}

const char *cpu_probe_form_name(int form)
{
    cpu_isa isa = cpu_isa_active();
    if (isa != CPU_ISA_AVX512 && isa != CPU_ISA_AVX2) return "plain loop"; /* every form is sum_plain */
    static const char *name[CPU_PROBE_FORMS] = {"1 KB to L1", "4 KB to L2", "no prefetch", "4 KB non-temporal"};
    return form >= 0 && form < CPU_PROBE_FORMS ? name[form] : "?";
}

/* Sum n floats (n a multiple of 64, p 64-byte aligned) with variant v. */
static float probe_sum(cpu_isa isa, int v, const float *p, size_t n)
{
#if defined(__x86_64__)
    static float (*const f512[CPU_PROBE_FORMS])(const float *, size_t) = {sum512_l1, sum512_l2, sum512_hw, sum512_nt};
    static float (*const f256[CPU_PROBE_FORMS])(const float *, size_t) = {sum256_l1, sum256_l2, sum256_hw, sum256_nt};
    if (isa == CPU_ISA_AVX512) return f512[v](p, n);
    if (isa == CPU_ISA_AVX2) return f256[v](p, n);
#endif
    (void)v;
    return sum_plain(p, n);
}

typedef struct read_job {
    const float *buf;
    size_t n; /* floats, a multiple of 64 * threads */
    cpu_isa isa;
    int variant;
    float sink[256];
} read_job;

static void read_task(void *arg, int ith, int nth)
{
    read_job *j = arg;
    size_t slice = j->n / (size_t)nth;
    const float *p = j->buf + slice * (size_t)ith;
    j->sink[ith % 256] = probe_sum(j->isa, j->variant, p, slice);
}

/* The same loop over memory that already exists (the model's weights): each
 * thread sums its share of every region in turn, one pool run a pass. A
 * region is trimmed to whole 64-byte lines at both ends, and a thread's
 * share is whole 256-byte steps (the loops' unit), so a few hundred bytes a
 * region may go unread: the rate is taken over the bytes actually read. */
typedef struct regions_job {
    const probe_region *r;
    int n;
    cpu_isa isa;
    int variant;
    float sink[256];
} regions_job;

static void region_span(const probe_region *r, uintptr_t *lo, size_t *floats)
{
    uintptr_t a = ((uintptr_t)r->p + 63) & ~(uintptr_t)63, e = ((uintptr_t)r->p + r->bytes) & ~(uintptr_t)63;
    *lo = a;
    *floats = e > a ? (e - a) / sizeof(float) : 0;
}

static void regions_task(void *arg, int ith, int nth)
{
    regions_job *j = arg;
    float s = 0;
    for (int i = 0; i < j->n; i++) {
        uintptr_t lo;
        size_t floats, units;
        region_span(&j->r[i], &lo, &floats);
        units = floats / 64; /* 256-byte steps */
        size_t a = units * (size_t)ith / (size_t)nth, b = units * (size_t)(ith + 1) / (size_t)nth;
        const float *p = (const float *)lo + a * 64;
        s += probe_sum(j->isa, j->variant, p, (b - a) * 64);
    }
    j->sink[ith % 256] = s;
}

double cpu_probe_read_pass(thread_pool *pool, const probe_region *r, int n, size_t *bytes_read)
{
    return cpu_probe_read_forms(pool, r, n, bytes_read, NULL);
}

double cpu_probe_read_forms(thread_pool *pool, const probe_region *r, int n, size_t *bytes_read, double *form_s)
{
    regions_job j = {.r = r, .n = n, .isa = cpu_isa_active()};
    size_t total = 0;
    int nth = pool_size(pool);
    for (int i = 0; i < n; i++) {
        uintptr_t lo;
        size_t floats;
        region_span(&r[i], &lo, &floats);
        size_t units = floats / 64;
        for (int t = 0; t < nth; t++)
            total += (units * (size_t)(t + 1) / (size_t)nth - units * (size_t)t / (size_t)nth) * 256;
    }
    double best = 1e30;
    for (j.variant = 0; j.variant < CPU_PROBE_FORMS; j.variant++) {
        double t0 = now_s();
        pool_run(pool, regions_task, &j, nth);
        double t = now_s() - t0;
        if (form_s) form_s[j.variant] = t;
        if (t < best) best = t;
    }
    if (bytes_read) *bytes_read = total;
    return best;
}

spark_status cpu_probe_bandwidth(int n_threads, size_t bytes, int reps, double *gb_s)
{
    *gb_s = 0;
    if (n_threads < 1) n_threads = 1;
    size_t unit = 64 * sizeof(float) * (size_t)n_threads;
    bytes = bytes / unit * unit;
    if (bytes == 0) bytes = unit;
    /* the kind of memory the weights are read into (io/mapped_file.c's copy):
     * 2 MiB-aligned, transparent huge pages asked for; an aligned_alloc
     * buffer on 4 KiB pages read ~10 % slower (bench/RESULTS.md) */
    const size_t huge = (size_t)2 << 20, region_len = bytes + huge;
    void *region = mmap(NULL, region_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) return spark_fail(SPARK_ERR_NOMEM, "bandwidth probe: cannot allocate %zu bytes", bytes);
    float *buf = (float *)(((uintptr_t)region + huge - 1) & ~(uintptr_t)(huge - 1));
#ifdef MADV_HUGEPAGE
    madvise(buf, bytes, MADV_HUGEPAGE); /* a refusal leaves 4 KiB pages: still a valid probe */
#endif
    memset(buf, 0, bytes); /* fault every page in before timing */
    thread_pool *pool;
    spark_status st = pool_create(n_threads, &pool);
    if (st != SPARK_OK) {
        munmap(region, region_len);
        return st;
    }
    read_job j = {.buf = buf, .n = bytes / sizeof(float), .isa = cpu_isa_active()};
    double best = 1e30;
    for (int r = 0; r < (reps > 0 ? reps : 1); r++)
        for (j.variant = 0; j.variant < CPU_PROBE_FORMS; j.variant++) {
            double t0 = now_s();
            pool_run(pool, read_task, &j, n_threads);
            double t = now_s() - t0;
            if (t < best) best = t;
        }
    pool_free(pool);
    munmap(region, region_len);
    *gb_s = (double)bytes / best / 1e9;
    return SPARK_OK;
}

/* ---- FMA peak -------------------------------------------------------------------- */

enum { NACC = 16, NACC_AVX2 = 12, FMA_ITERS = 1 << 24 };

#if defined(__x86_64__)
/* NACC independent chains of zmm FMAs: 16 lanes x 2 flops per instruction. */
__attribute__((target("avx512f"))) static double fma_avx512(long iters, float *sink)
{
    __m512 acc[NACC], m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < NACC; k++) acc[k] = _mm512_set1_ps((float)k);
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int k = 0; k < NACC; k++) acc[k] = _mm512_fmadd_ps(acc[k], m, a);
    __m512 s = acc[0];
    for (int k = 1; k < NACC; k++) s = _mm512_add_ps(s, acc[k]);
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * NACC * 16 * 2;
}

/* 12 chains: 16 ymm registers hold them plus the two constants. */
__attribute__((target("avx2,fma"))) static double fma_avx2(long iters, float *sink)
{
    __m256 acc[NACC_AVX2], m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
    for (int k = 0; k < NACC_AVX2; k++) acc[k] = _mm256_set1_ps((float)k);
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int k = 0; k < NACC_AVX2; k++) acc[k] = _mm256_fmadd_ps(acc[k], m, a);
    __m256 s = acc[0];
    for (int k = 1; k < NACC_AVX2; k++) s = _mm256_add_ps(s, acc[k]);
    float t[8];
    _mm256_storeu_ps(t, s);
    *sink = t[0] + t[7];
    return (double)iters * NACC_AVX2 * 8 * 2;
}
#endif

#if defined(__aarch64__) && defined(__ARM_NEON)
static double fma_neon(long iters, float *sink)
{
    float32x4_t acc[NACC], m = vdupq_n_f32(0.999999f), a = vdupq_n_f32(1e-7f);
    for (int k = 0; k < NACC; k++) acc[k] = vdupq_n_f32((float)k);
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < NACC; k++) acc[k] = vfmaq_f32(a, acc[k], m);
    float32x4_t s = acc[0];
    for (int k = 1; k < NACC; k++) s = vaddq_f32(s, acc[k]);
    *sink = vaddvq_f32(s);
    return (double)iters * NACC * 4 * 2;
}
#endif

static double fma_plain(long iters, float *sink)
{
    float acc[NACC];
    for (int k = 0; k < NACC; k++) acc[k] = (float)k;
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < NACC; k++) acc[k] = acc[k] * 0.999999f + 1e-7f;
    float s = 0;
    for (int k = 0; k < NACC; k++) s += acc[k];
    *sink = s;
    return (double)iters * NACC * 2;
}

typedef struct fma_job {
    cpu_isa isa;
    long iters;
    double flops[256];
    float sink[256];
} fma_job;

static void fma_task(void *arg, int ith, int nth)
{
    fma_job *j = arg;
    int slot = ith % 256;
    double (*fn)(long, float *) = fma_plain;
#if defined(__x86_64__)
    if (j->isa == CPU_ISA_AVX512) fn = fma_avx512;
    else if (j->isa == CPU_ISA_AVX2) fn = fma_avx2;
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
    if (j->isa == CPU_ISA_NEON) fn = fma_neon;
#endif
    j->flops[slot] = fn(j->iters, &j->sink[slot]);
}

/* The best of `reps` timed pool runs of a peak probe: the threads' flops
 * (task writes flops[ith]) over the run's wall time, flop/s. */
static double best_flop_rate(thread_pool *pool, pool_task_fn task, void *job, const double *flops, int n_threads,
                             int reps)
{
    double best = 0;
    for (int r = 0; r < (reps > 0 ? reps : 1); r++) {
        double t0 = now_s();
        pool_run(pool, task, job, n_threads);
        double t = now_s() - t0, sum = 0;
        for (int i = 0; i < n_threads && i < 256; i++) sum += flops[i];
        if (sum / t > best) best = sum / t;
    }
    return best;
}

spark_status cpu_probe_fma_peak(int n_threads, int reps, double *gflop_s)
{
    *gflop_s = 0;
    if (n_threads < 1) n_threads = 1;
    thread_pool *pool;
    TRY(pool_create(n_threads, &pool));
    fma_job j = {.isa = cpu_isa_active(), .iters = FMA_ITERS / 8};
    pool_run(pool, fma_task, &j, n_threads); /* warm-up: clocks up, threads awake */
    j.iters = j.isa == CPU_ISA_SCALAR ? FMA_ITERS / 8 : FMA_ITERS;
    *gflop_s = best_flop_rate(pool, fma_task, &j, j.flops, n_threads, reps) / 1e9;
    pool_free(pool);
    return SPARK_OK;
}

typedef struct amx_job {
    long iters;
    double flops[256];
} amx_job;

static void amx_task(void *arg, int ith, int nth)
{
    amx_job *j = arg;
    j->flops[ith % 256] = cpu_amx_tile_flops(j->iters);
}

/* As the FMA probe, with the tile unit's loop (amx.c). */
spark_status cpu_probe_amx_peak(int n_threads, int reps, double *gflop_s)
{
    *gflop_s = 0;
    if (!cpu_amx_available()) return SPARK_OK;
    if (n_threads < 1) n_threads = 1;
    thread_pool *pool;
    TRY(pool_create(n_threads, &pool));
    amx_job j = {.iters = 1L << 17};
    pool_run(pool, amx_task, &j, n_threads); /* warm-up: clocks up, tile state granted, threads awake */
    j.iters = 1L << 20; /* ~4M tile products a thread: ~30-60 ms */
    *gflop_s = best_flop_rate(pool, amx_task, &j, j.flops, n_threads, reps) / 1e9;
    pool_free(pool);
    return SPARK_OK;
}

const char *cpu_model_name(void)
{
    static char name[128] = "";
    if (name[0]) return name;
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (colon && (!strncmp(line, "model name", 10) || !strncmp(line, "Model", 5))) {
            colon++;
            while (*colon == ' ' || *colon == '\t') colon++;
            snprintf(name, sizeof name, "%s", colon);
            name[strcspn(name, "\n")] = '\0';
            break;
        }
    }
    if (f) fclose(f);
    if (!name[0]) snprintf(name, sizeof name, "unknown");
    return name;
}

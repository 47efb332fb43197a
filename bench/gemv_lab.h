/*
 * gemv_lab.h — what the GEMV laboratories (gemv_lab.c for Q8_0,
 * gemv_lab_bf16.c for bf16) share: a clock, the probe's loop on a range of
 * bytes, matmul.c's guided row claims, a 2 MiB-aligned buffer with
 * transparent huge pages, the LAB_VARIANTS choice and the per-variant
 * report against the first variant in the same round. Scratch tools, not
 * the backend (whose code they imitate, not call).
 */
#ifndef SPARK_BENCH_GEMV_LAB_H
#define SPARK_BENCH_GEMV_LAB_H

#include <immintrin.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { LAB_MAX_VARIANTS = 64, LAB_MAX_ROUNDS = 64 };

static double lab_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the probe's loop (probe.c) on [p, p + n): pf bytes ahead to L1, or no prefetch */
__attribute__((target("avx512f"))) static float lab_stream_sum(const uint8_t *p, size_t n, int pf)
{
    __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        if (pf)
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)(p + i) + pf + 64 * k, _MM_HINT_T0);
        a = _mm512_add_ps(a, _mm512_loadu_ps((const float *)(p + i)));
        b = _mm512_add_ps(b, _mm512_loadu_ps((const float *)(p + i + 64)));
        c = _mm512_add_ps(c, _mm512_loadu_ps((const float *)(p + i + 128)));
        d = _mm512_add_ps(d, _mm512_loadu_ps((const float *)(p + i + 192)));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}

/* The 4B shape (SPEC §1) and its decode's matrices: 36 layers of six, then the head. */
enum { E = 2560, FF = 10240, QKV = 6144, HEADS = 16, QD = 4096, LAYERS = 36, VOCAB = 131072, PER_LAYER = 6 };

typedef struct mat { int64_t rows, cols; const uint8_t *data; size_t rb; } mat;

/* [lo, hi) of part ith of nth of n items, bounds whole multiples of align (the last part takes the rest) */
static void lab_split(int64_t n, int ith, int nth, int64_t align, int64_t *lo, int64_t *hi)
{
    *lo = n * ith / nth / align * align;
    *hi = ith == nth - 1 ? n : n * (ith + 1) / nth / align * align;
}

/* matmul.c's claim_rows: 1/(div nth) of the rows still unclaimed, whole 16-row groups, >= min_rows */
static int lab_claim(_Atomic int64_t *next, int64_t rows, int nth, int div, int64_t min_rows, int64_t *lo, int64_t *hi)
{
    int64_t cur = atomic_load_explicit(next, memory_order_relaxed);
    for (;;) {
        if (cur >= rows) return 0;
        int64_t left = rows - cur, take = nth == 1 ? left : left / (div * nth);
        take = (take + 15) / 16 * 16;
        if (take < min_rows) take = min_rows;
        if (take > left) take = left;
        if (atomic_compare_exchange_weak_explicit(next, &cur, cur + take, memory_order_relaxed, memory_order_relaxed)) {
            *lo = cur, *hi = cur + take;
            return 1;
        }
    }
}

/* bytes in a 2 MiB-aligned anonymous mapping with huge pages asked for (as the loader's copy) */
static uint8_t *lab_thp_buffer(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    uint8_t *region = mmap(NULL, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    uint8_t *buf = (uint8_t *)(((uintptr_t)region + huge - 1) & ~(uintptr_t)(huge - 1));
    madvise(buf, bytes, MADV_HUGEPAGE);
    return buf;
}

/* The decode's matrices in one THP buffer (lab_thp_buffer), rows of
 * row_bytes(cols) bytes, each matrix 64-byte aligned; the buffer's bytes are
 * left for the caller to fill. Returns the matrices (*nmat of them). */
static mat *lab_layout(size_t (*row_bytes)(int64_t cols), int *nmat, size_t *total, uint8_t **buf)
{
    static const int64_t shape[PER_LAYER][2] = {{QKV, E}, {HEADS, E}, {E, QD}, {FF, E}, {FF, E}, {E, FF}};
    const int n = LAYERS * PER_LAYER + 1;
    mat *ms = calloc((size_t)n, sizeof *ms);
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        ms[i].rows = i < LAYERS * PER_LAYER ? shape[i % PER_LAYER][0] : VOCAB;
        ms[i].cols = i < LAYERS * PER_LAYER ? shape[i % PER_LAYER][1] : E;
        ms[i].rb = row_bytes(ms[i].cols);
        bytes += (ms[i].rb * (size_t)ms[i].rows + 63) & ~(size_t)63;
    }
    *buf = lab_thp_buffer(bytes);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        ms[i].data = *buf + off;
        off += (ms[i].rb * (size_t)ms[i].rows + 63) & ~(size_t)63;
    }
    *nmat = n;
    *total = bytes;
    return ms;
}

/* LAB_VARIANTS=0,3,4 (the first is the reference), else all nv; returns the count */
static int lab_variants(int nv, int *use)
{
    const char *sel = getenv("LAB_VARIANTS");
    int nu = 0;
    if (!sel) {
        for (int i = 0; i < nv && i < LAB_MAX_VARIANTS; i++) use[nu++] = i;
        return nu;
    }
    for (const char *p = sel; *p && nu < LAB_MAX_VARIANTS;) {
        int v = atoi(p);
        if (v < 0 || v >= nv) {
            fprintf(stderr, "LAB_VARIANTS: %d is not a variant (0-%d)\n", v, nv - 1);
            exit(1);
        }
        use[nu++] = v;
        while (*p && *p != ',') p++;
        if (*p) p++;
    }
    return nu;
}

static void lab_sort(double *s, int n)
{
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            if (s[b] < s[a]) {
                double t = s[a];
                s[a] = s[b];
                s[b] = t;
            }
}

/* per variant: GB/s min / median / max over the rounds, and the median and
 * range of its ratio to variant use[0] in the same round */
static void lab_report(const char *const *names, double gbs[][LAB_MAX_ROUNDS], const int *use, int nu, int rounds)
{
    for (int k = 0; k < nu; k++) {
        int v = use[k];
        double s[LAB_MAX_ROUNDS], rt[LAB_MAX_ROUNDS];
        for (int a = 0; a < rounds; a++) s[a] = gbs[v][a], rt[a] = gbs[v][a] / gbs[use[0]][a];
        lab_sort(s, rounds);
        lab_sort(rt, rounds);
        printf("%-34s GB/s min %.2f med %.2f max %.2f | vs #%d: med %.3f [%.3f, %.3f]\n", names[v], s[0],
               s[rounds / 2], s[rounds - 1], use[0], rt[rounds / 2], rt[0], rt[rounds - 1]);
    }
}

#endif

/*
 * gemv_lab.c — variants of the single-token int16 Q8_0 GEMV (lane count,
 * prefetch distance and hint, piece claiming, no arithmetic at all) run
 * over one THP buffer laid out as the 4B decode's 217 matrices, each
 * variant once per round with the order rotated, against the probe's loop
 * over the same bytes (variant 0). A scratch laboratory, not the backend:
 * its tile copies kernels_x8.inc's with fake scales (bench/RESULTS.md,
 * 2026-12-01, "Decode GEMV in 2 lanes on AMD").
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o /tmp/gemv_lab bench/gemv_lab.c build/libspark.a \
 *      -lpcre2-8 -lcjson -lmicrohttpd -lm -lpthread -fopenmp
 *   (a build with nvcc also needs -L/usr/local/cuda/lib64 -lcublas -lcudart -lstdc++)
 *   /tmp/gemv_lab [rounds]        LAB_VARIANTS=0,1,4 picks variants (the first is the reference)
 * x86-64 with AVX-512 only.
 */
#include "backend/cpu/threadpool.h"

#include "io/dtype.h"

#include <immintrin.h>
#include <stdatomic.h>
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

enum { E = 2560, FF = 10240, QKV = 6144, HEADS = 16, QD = 4096, LAYERS = 36, VOCAB = 131072, PER_LAYER = 6 };

typedef struct mat { int64_t rows, cols; const uint8_t *data; size_t rb; } mat;

static int16_t xq[FF] __attribute__((aligned(64)));
static float xd[FF / 32];
static float fake_f16[65536];

#define T __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) static inline

#define DEF_TILE(NAME, HINT)                                                                             \
    T void NAME(const uint8_t *w, size_t rb, const int R, int64_t cols, float *y, int64_t yr, int pf)     \
    {                                                                                                    \
        __m512 acc[16];                                                                                  \
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();                                        \
        for (int64_t b = 0; b < cols / 32; b++) {                                                        \
            if (pf)                                                                                      \
                for (int r = 0; r < R; r++) {                                                            \
                    _mm_prefetch((const char *)w + (size_t)r * rb + pf + b * 34, HINT);                  \
                }                                                                                        \
            const __m512i xv = _mm512_loadu_si512(xq + 32 * b);                                          \
            __m512 dx = _mm512_set1_ps(xd[b]);                                                           \
            __asm__("" : "+v"(dx));                                                                      \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                          \
            {                                                                                            \
                const uint8_t *blk = w + (size_t)r * rb + (size_t)b * 34;                                \
                __m512i p = _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 2))), xv); \
                __m512 s = _mm512_mul_ps(_mm512_set1_ps(fake_f16[blk[0] | (blk[1] << 8)]), dx);       \
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r]);                              \
            }                                                                                            \
        }                                                                                                \
        for (int r = 0; r < R; r++) y[r * yr] = _mm512_reduce_add_ps(acc[r]);                          \
    }

/* prefetch each 64-byte line once: when block b's prefetch address crosses a line */
DEF_TILE(tile_t1, _MM_HINT_T1)
DEF_TILE(tile_t0, _MM_HINT_T0)
DEF_TILE(tile_nta, _MM_HINT_NTA)

/* loads only: the same access pattern, no arithmetic */
T void tile_noarith(const uint8_t *w, size_t rb, const int R, int64_t cols, float *y, int64_t yr, int pf)
{
    __m512i acc[16];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
    for (int64_t b = 0; b < cols / 32; b++) {
        if (pf)
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)w + (size_t)r * rb + pf + b * 34, _MM_HINT_T1);
#pragma GCC unroll 16
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_or_si512(acc[r], _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w + (size_t)r * rb + (size_t)b * 34 + 2))));
    }
    for (int r = 0; r < R; r++) y[r * yr] = (float)_mm512_reduce_or_epi32(acc[r]);
}


T void tile_gen(const uint8_t *w, size_t rb, size_t ls, const int R, const int A, int64_t cols, float *y, int64_t yr, int pf, int pfstep)
{
    __m512 acc[16];
    const uint8_t *rowp[16];
    for (int r = 0; r < R; r++) { acc[r] = _mm512_setzero_ps(); rowp[r] = w + (size_t)(r / A) * ls + (size_t)(r % A) * rb; }
    for (int64_t b = 0; b < cols / 32; b++) {
        if (pf && (b % pfstep) == 0)
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)rowp[r] + pf + b * 34, _MM_HINT_T1);
        const __m512i xv = _mm512_loadu_si512(xq + 32 * b);
        __m512 dx = _mm512_set1_ps(xd[b]);
        __asm__("" : "+v"(dx));
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = rowp[r] + (size_t)b * 34;
            __m512i p = _mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 2))), xv);
            __m512 s = _mm512_mul_ps(_mm512_set1_ps(fake_f16[blk[0] | (blk[1] << 8)]), dx);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), s, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) y[(r / A) * yr + r % A] = _mm512_reduce_add_ps(acc[r]);
}
/* L lanes, A adjacent rows a lane per tile */
#define GEN_FN(NAME, L, A, PFSTEP)                                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) static void NAME(const uint8_t *wb, size_t rb, int64_t rows, int64_t cols, float *y, int pf) \
    {                                                                                                  \
        int64_t q = rows / (L) / (A) * (A); /* rows a lane */                                          \
        for (int64_t t = 0; t < q; t += (A)) tile_gen(wb + (size_t)t * rb, rb, rb * (size_t)q, (L) * (A), (A), cols, y + t, q, pf, PFSTEP); \
        for (int64_t r = q * (L); r < rows; r++) tile_gen(wb + (size_t)r * rb, rb, 0, 1, 1, cols, y + r, 1, pf, PFSTEP); \
    }
GEN_FN(h_1x1, 1, 1, 1)
GEN_FN(h_1x4, 1, 4, 1)
GEN_FN(h_1x8, 1, 8, 1)
GEN_FN(h_2x1, 2, 1, 1)
GEN_FN(h_2x2, 2, 2, 1)
GEN_FN(h_2x4, 2, 4, 1)
GEN_FN(h_2x4s2, 2, 4, 2)
GEN_FN(h_1x8s2, 1, 8, 2)
GEN_FN(h_8x1, 8, 1, 1)
GEN_FN(h_3x1, 3, 1, 1)
GEN_FN(h_4x2, 4, 2, 1)

typedef void (*tile_fn)(const uint8_t *, size_t, int, int64_t, float *, int64_t, int);

#define LANES_FN(NAME, TILE, RR)                                                                         \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) static void NAME(const uint8_t *wb, size_t rb, int64_t rows, int64_t cols, float *y, int pf) \
    {                                                                                                    \
        int64_t q = rows / (RR);                                                                         \
        for (int64_t t = 0; t < q; t++) TILE(wb + (size_t)t * rb, rb * (size_t)q, RR, cols, y + t, q, pf); \
        for (int64_t r = q * (RR); r < rows; r++) TILE(wb + (size_t)r * rb, rb, 1, cols, y + r, 1, pf);    \
    }
LANES_FN(g_t1_8, tile_t1, 8)
LANES_FN(g_t1_4, tile_t1, 4)
LANES_FN(g_t1_2, tile_t1, 2)
LANES_FN(g_t1_16, tile_t1, 16)
LANES_FN(g_t0_8, tile_t0, 8)
LANES_FN(g_nta_8, tile_nta, 8)
LANES_FN(g_noar_8, tile_noarith, 8)
LANES_FN(g_noar_2, tile_noarith, 2)
LANES_FN(g_t1_1, tile_t1, 1)
LANES_FN(g_t1_3, tile_t1, 3)
LANES_FN(g_t0_2, tile_t0, 2)
LANES_FN(g_t0_1, tile_t0, 1)
LANES_FN(g_t0_3, tile_t0, 3)
LANES_FN(g_t0_4, tile_t0, 4)
LANES_FN(g_t1_4b, tile_t1, 4)

typedef void (*lab_gemv_fn)(const uint8_t *, size_t, int64_t, int64_t, float *, int);

/* the probe's loop on a range of bytes */
__attribute__((target("avx512f"))) static float stream_sum(const uint8_t *p, size_t n, int pf)
{
    __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        if (pf) {
            _mm_prefetch((const char *)(p + i) + pf, _MM_HINT_T0);
            _mm_prefetch((const char *)(p + i) + pf + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)(p + i) + pf + 128, _MM_HINT_T0);
            _mm_prefetch((const char *)(p + i) + pf + 192, _MM_HINT_T0);
        }
        a = _mm512_add_ps(a, _mm512_loadu_ps((const float *)(p + i)));
        b = _mm512_add_ps(b, _mm512_loadu_ps((const float *)(p + i + 64)));
        c = _mm512_add_ps(c, _mm512_loadu_ps((const float *)(p + i + 128)));
        d = _mm512_add_ps(d, _mm512_loadu_ps((const float *)(p + i + 192)));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}

typedef struct job {
    const mat *m, *nextm; /* nextm: the matrix after this one (cross-boundary prefetch), or NULL */
    int ahead_kb;
    lab_gemv_fn fn; /* NULL: stream */
    int pf, guided, div, minkb, prime;
    float *y;
    _Atomic int64_t next;
    float sink[2];
} job;

static int claim_rows(job *j, int64_t rows, int nth, int64_t min_rows, int64_t *lo, int64_t *hi)
{
    int64_t cur = atomic_load_explicit(&j->next, memory_order_relaxed);
    for (;;) {
        if (cur >= rows) return 0;
        int64_t left = rows - cur, take = nth == 1 ? left : left / (j->div * nth);
        take = (take + 15) / 16 * 16;
        if (take < min_rows) take = min_rows;
        if (take > left) take = left;
        if (atomic_compare_exchange_weak_explicit(&j->next, &cur, cur + take, memory_order_relaxed, memory_order_relaxed)) {
            *lo = cur, *hi = cur + take;
            return 1;
        }
    }
}

static void task(void *arg, int ith, int nth)
{
    job *j = arg;
    const mat *m = j->m;
    if (!j->fn) { /* contiguous halves, the probe's loop */
        size_t bytes = (size_t)m->rows * m->rb, lo = bytes * ith / nth / 256 * 256, hi = ith == nth - 1 ? bytes : bytes * (ith + 1) / nth / 256 * 256;
        size_t tail = (size_t)j->ahead_kb * 1024;
        if (j->nextm && hi - lo > 2 * tail) {
            j->sink[ith & 1] += stream_sum(m->data + lo, hi - lo - tail, j->pf);
            const mat *n = j->nextm;
            size_t nb = (size_t)n->rows * n->rb, nlo = nb * ith / nth / 256 * 256;
            for (size_t o = 0; o < tail && nlo + o < nb; o += 64) _mm_prefetch((const char *)n->data + nlo + o, _MM_HINT_T1);
            j->sink[ith & 1] += stream_sum(m->data + hi - tail, tail, j->pf);
            return;
        }
        j->sink[ith & 1] += stream_sum(m->data + lo, hi - lo, j->pf);
        return;
    }
    if (!j->guided) {
        int64_t lo = m->rows * ith / nth / 16 * 16, hi = ith == nth - 1 ? m->rows : m->rows * (ith + 1) / nth / 16 * 16;
        j->fn(m->data + (size_t)lo * m->rb, m->rb, hi - lo, m->cols, j->y + lo, j->pf);
        return;
    }
    int64_t min_rows = (int64_t)((size_t)j->minkb * 1024 / m->rb) / 16 * 16;
    if (min_rows < 16) min_rows = 16;
    for (int64_t lo, hi; claim_rows(j, m->rows, nth, min_rows, &lo, &hi);) {
        if (j->prime) { /* the first pf bytes of both lanes */
            const uint8_t *a = m->data + (size_t)lo * m->rb, *b = a + (size_t)((hi - lo) / 2) * m->rb;
            for (int o = 0; o < j->pf; o += 64) { _mm_prefetch((const char *)a + o, _MM_HINT_T1); _mm_prefetch((const char *)b + o, _MM_HINT_T1); }
        }
        j->fn(m->data + (size_t)lo * m->rb, m->rb, hi - lo, m->cols, j->y + lo, j->pf);
    }
}

typedef struct variant { const char *name; lab_gemv_fn fn; int pf, guided, div, minkb, prime, ahead_kb; } variant;

int main(int argc, char **argv)
{
    int threads = 2, rounds = argc > 1 ? atoi(argv[1]) : 6;
    static const int64_t shape[PER_LAYER][2] = {{QKV, E}, {HEADS, E}, {E, QD}, {FF, E}, {FF, E}, {E, FF}};
    int nmat = LAYERS * PER_LAYER + 1;
    mat *ms = calloc((size_t)nmat, sizeof *ms);
    size_t total = 0;
    for (int i = 0; i < nmat; i++) {
        ms[i].rows = i < LAYERS * PER_LAYER ? shape[i % PER_LAYER][0] : VOCAB;
        ms[i].cols = i < LAYERS * PER_LAYER ? shape[i % PER_LAYER][1] : E;
        ms[i].rb = (size_t)ms[i].cols / 32 * 34;
        total += (ms[i].rb * (size_t)ms[i].rows + 63) & ~(size_t)63;
    }
    const size_t huge = (size_t)2 << 20;
    uint8_t *region = mmap(NULL, total + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *buf = (uint8_t *)(((uintptr_t)region + huge - 1) & ~(uintptr_t)(huge - 1));
    madvise(buf, total, MADV_HUGEPAGE);
    for (size_t i = 0; i < total; i++) buf[i] = (uint8_t)((i * 2654435761u) >> 13);
    size_t off = 0;
    for (int i = 0; i < nmat; i++) {
        ms[i].data = buf + off;
        off += (ms[i].rb * (size_t)ms[i].rows + 63) & ~(size_t)63;
    }
    for (int i = 0; i < 65536; i++) fake_f16[i] = 1e-3f * (float)(i & 255);
    for (int i = 0; i < FF; i++) xq[i] = (int16_t)(i * 37 % 2001 - 1000);
    for (int i = 0; i < FF / 32; i++) xd[i] = 1e-4f;
    float *y = malloc(sizeof(float) * VOCAB);
    thread_pool *pool;
    pool_create(threads, &pool);
    variant all[] = {
        {"stream(probe loop) pf1k", NULL, 1024, 0},
        {"2l pf4k guided /2nth 128k (new)", g_t1_2, 4096, 1},
        {"2l pf4k equal halves", g_t1_2, 4096, 0},
        {"2l pf4k guided /nth 512k", g_t1_2, 4096, 1, 1, 512},
        {"2l pf4k guided /2nth 512k", g_t1_2, 4096, 1, 2, 512},
        {"2l pf4k guided /2nth 128k prime", g_t1_2, 4096, 1, 2, 128, 1},
        {"2l pf4k guided /nth 512k prime", g_t1_2, 4096, 1, 1, 512, 1},
        {"8l pf1k guided (old)", g_t1_8, 1024, 1},
        {"2l pf4k T0 guided", g_t0_2, 4096, 1},
        {"stream, whole buffer one region", NULL, 1024, -1},
        {"stream, next matrix 4 KB prefetched", NULL, 1024, 0, 0, 0, 0, 4},
        {"stream, next matrix 16 KB prefetched", NULL, 1024, 0, 0, 0, 0, 16},
    };
    int nv = sizeof all / sizeof all[0];
    const char *sel = getenv("LAB_VARIANTS"); /* e.g. "0,1,4" */
    int use[64], nu = 0;
    if (sel) {
        for (const char *p = sel; *p;) { use[nu++] = atoi(p); while (*p && *p != ',') p++; if (*p) p++; }
    } else
        for (int i = 0; i < nv; i++) use[nu++] = i;
    double gbs[64][64];
    for (int r = 0; r < rounds + 1; r++)
        for (int k = 0; k < nu; k++) {
            int v = use[(k + r) % nu]; /* rotate the order each round */
            double t0 = now_s();
            if (all[v].guided < 0) { /* one region over every matrix's bytes */
                mat whole = {.rows = (int64_t)(total / 256), .cols = 0, .data = buf, .rb = 256};
                job j = {.m = &whole, .fn = NULL, .pf = all[v].pf, .y = y};
                pool_run(pool, task, &j, threads);
            } else
            for (int i = 0; i < nmat; i++) {
                job j = {.m = &ms[i], .fn = all[v].fn, .pf = all[v].pf, .guided = all[v].guided, .y = y,
                         .div = all[v].div ? all[v].div : 2, .minkb = all[v].minkb ? all[v].minkb : 128, .prime = all[v].prime,
                         .nextm = all[v].ahead_kb && i + 1 < nmat ? &ms[i + 1] : NULL, .ahead_kb = all[v].ahead_kb};
                pool_run(pool, task, &j, threads);
            }
            double t = now_s() - t0;
            if (r > 0) gbs[v][r - 1] = (double)total / t / 1e9;
        }
    for (int k = 0; k < nu; k++) {
        int v = use[k];
        double s[64];
        memcpy(s, gbs[v], sizeof(double) * rounds);
        for (int a = 0; a < rounds; a++) for (int b = a + 1; b < rounds; b++) if (s[b] < s[a]) { double t = s[a]; s[a] = s[b]; s[b] = t; }
        /* ratio to variant use[0] in the same round */
        double rt[64];
        for (int a = 0; a < rounds; a++) rt[a] = gbs[v][a] / gbs[use[0]][a];
        for (int a = 0; a < rounds; a++) for (int b = a + 1; b < rounds; b++) if (rt[b] < rt[a]) { double t = rt[a]; rt[a] = rt[b]; rt[b] = t; }
        printf("%-34s GB/s min %.2f med %.2f max %.2f | vs #%d: med %.3f [%.3f, %.3f]\n", all[v].name, s[0], s[rounds / 2], s[rounds - 1], use[0], rt[rounds / 2], rt[0], rt[rounds - 1]);
    }
    return 0;
}

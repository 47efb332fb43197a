/*
 * gemv_lab_bf16.c — variants of the single-token bf16 GEMV (lanes,
 * prefetch distance and hint, how a bf16 vector becomes floats, loads
 * alone) over one THP buffer laid out as the 4B decode's 217 matrices,
 * each variant once per round with the order rotated, against the probe's
 * loop over the same bytes (variant 0). Rows are claimed as matmul.c's
 * gemv_task does (guided pieces, >= 128 KB). A scratch laboratory, as
 * gemv_lab.c is for Q8_0: its tiles copy kernels_simd.inc's plain tile.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o /tmp/gemv_lab_bf16 bench/gemv_lab_bf16.c \
 *      build/libspark.a -lpcre2-8 -lcjson -lmicrohttpd -lm -lpthread -fopenmp
 *   (a build with nvcc also needs -L/usr/local/cuda/lib64 -lcublas -lcudart -lstdc++)
 *   /tmp/gemv_lab_bf16 [rounds]    LAB_VARIANTS=0,1,4 picks variants (the first is the reference)
 * x86-64 with AVX-512 only.
 */
#include "backend/cpu/threadpool.h"

#include "gemv_lab.h"

static float xf[FF] __attribute__((aligned(64)));
static float xeo[FF] __attribute__((aligned(64))); /* per 32 columns: 16 even, then 16 odd */

#define T __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) static inline
#define LOAD_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))

/* kind 0: kernels_simd.inc's tile (two zero-extending loads a line);
 * kind 1: one 64-byte load, even values by a shift, odd by a mask, x
 * reordered to match; kind 2: loads only (an OR per line). */
T void tile(const uint8_t *w, size_t rb, const int R, int64_t cols, float *y, int64_t yr, const int pf,
            const int hint, const int kind)
{
    __m512 acc[16], acc2[16];
    __m512i orr[16];
    for (int r = 0; r < R; r++) acc[r] = acc2[r] = _mm512_setzero_ps(), orr[r] = _mm512_setzero_si512();
    const __m512i hi_mask = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int64_t c = 0; c + 32 <= cols; c += 32) {
        if (pf)
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                const char *p = (const char *)w + (size_t)r * rb + pf + 2 * c;
                if (hint == 0) _mm_prefetch(p, _MM_HINT_T0);
                else if (hint == 1) _mm_prefetch(p, _MM_HINT_T1);
                else _mm_prefetch(p, _MM_HINT_NTA);
            }
        if (kind == 0) {
            __m512 xv = _mm512_loadu_ps(xf + c), xw = _mm512_loadu_ps(xf + c + 16);
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                const uint8_t *row = w + (size_t)r * rb + 2 * c;
                acc[r] = _mm512_fmadd_ps(LOAD_BF16(row + 32), xw, _mm512_fmadd_ps(LOAD_BF16(row), xv, acc[r]));
            }
        } else if (kind == 1) {
            __m512 xe = _mm512_loadu_ps(xeo + c), xo = _mm512_loadu_ps(xeo + c + 16);
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                __m512i v = _mm512_loadu_si512(w + (size_t)r * rb + 2 * c);
                __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(v, hi_mask));
                acc[r] = _mm512_fmadd_ps(hi, xo, _mm512_fmadd_ps(lo, xe, acc[r]));
            }
        } else if (kind == 3) { /* kind 1 with two accumulators a row */
            __m512 xe = _mm512_loadu_ps(xeo + c), xo = _mm512_loadu_ps(xeo + c + 16);
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) {
                __m512i v = _mm512_loadu_si512(w + (size_t)r * rb + 2 * c);
                acc[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), xe, acc[r]);
                acc2[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hi_mask)), xo, acc2[r]);
            }
        } else {
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) orr[r] = _mm512_or_si512(orr[r], _mm512_loadu_si512(w + (size_t)r * rb + 2 * c));
        }
    }
    for (int r = 0; r < R; r++)
        y[r * yr] = kind == 2 ? (float)_mm512_reduce_or_epi32(orr[r]) : _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc2[r]));
}

typedef void (*lab_gemv_fn)(const uint8_t *, size_t, int64_t, int64_t, float *);

#define LANES_FN(NAME, RR, PF, HINT, KIND)                                                                  \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) static void NAME(const uint8_t *wb, size_t rb, \
                                                                                   int64_t rows, int64_t cols, float *y) \
    {                                                                                                       \
        int64_t q = rows / (RR);                                                                            \
        for (int64_t t = 0; t < q; t++) tile(wb + (size_t)t * rb, rb * (size_t)q, RR, cols, y + t, q, PF, HINT, KIND); \
        for (int64_t r = q * (RR); r < rows; r++) tile(wb + (size_t)r * rb, rb, 1, cols, y + r, 1, PF, HINT, KIND);    \
    }
LANES_FN(g8_1k_t1, 8, 1024, 1, 0)
LANES_FN(g8_2k_t1, 8, 2048, 1, 0)
LANES_FN(g8_1k_t0, 8, 1024, 0, 0)
LANES_FN(g8_1k_t1_eo, 8, 1024, 1, 1)
LANES_FN(g8_2k_t1_eo, 8, 2048, 1, 1)
LANES_FN(g4_2k_t1, 4, 2048, 1, 0)
LANES_FN(g8_1k_noar, 8, 1024, 1, 2)
LANES_FN(g16_512_t1, 16, 512, 1, 0)
LANES_FN(g8_512_t1, 8, 512, 1, 0)
LANES_FN(g2_4k_t1, 2, 4096, 1, 0)
LANES_FN(g8_0_eo, 8, 0, 1, 1)
LANES_FN(g4_4k_t1_eo, 4, 4096, 1, 1)
LANES_FN(g1_1k_t0_noar, 1, 1024, 0, 2)
LANES_FN(g1_1k_t0, 1, 1024, 0, 0)
LANES_FN(g1_1k_t0_eo, 1, 1024, 0, 1)
LANES_FN(g2_2k_t0_eo, 2, 2048, 0, 1)
LANES_FN(g4_1k_t0_eo, 4, 1024, 0, 1)
LANES_FN(g4_2k_t1_eo, 4, 2048, 1, 1)
LANES_FN(g2_2k_t1_eo, 2, 2048, 1, 1)
LANES_FN(g2_4k_t0_eo, 2, 4096, 0, 1)
LANES_FN(g2_1k_t0_eo, 2, 1024, 0, 1)
LANES_FN(g4_2k_t0_eo, 4, 2048, 0, 1)
LANES_FN(g2_2k_t0_eo2, 2, 2048, 0, 3)
LANES_FN(g4_2k_t1_eo2, 4, 2048, 1, 3)
LANES_FN(g2_2k_t0, 2, 2048, 0, 0)
LANES_FN(g3_2k_t0_eo2, 3, 2048, 0, 3)
LANES_FN(g4_2k_t0_eo2, 4, 2048, 0, 3)
LANES_FN(g3_2k_t1_eo2, 3, 2048, 1, 3)
LANES_FN(g4_3k_t1_eo2, 4, 3072, 1, 3)
LANES_FN(g3_2k_t1, 3, 2048, 1, 0)
LANES_FN(g3_3k_t0_eo2, 3, 3072, 0, 3)
LANES_FN(g4_1k_t1_eo2, 4, 1024, 1, 3)
LANES_FN(g3_4k_t0_eo2, 3, 4096, 0, 3)
LANES_FN(g3_3k_t0, 3, 3072, 0, 0)
LANES_FN(g3_3k_t0_eo, 3, 3072, 0, 1)
LANES_FN(g2_3k_t0_eo2, 2, 3072, 0, 3)
LANES_FN(g3_3k_t1_eo2, 3, 3072, 1, 3)

typedef struct job {
    const mat *m;
    lab_gemv_fn fn; /* NULL: stream */
    int halves;     /* rows in two equal halves instead of guided claims */
    float *y;
    _Atomic int64_t next;
    float sink[2];
} job;

static void task(void *arg, int ith, int nth)
{
    job *j = arg;
    const mat *m = j->m;
    if (!j->fn) { /* contiguous halves, the probe's loop */
        int64_t lo, hi;
        lab_split((int64_t)(m->rows * m->rb), ith, nth, 256, &lo, &hi);
        j->sink[ith & 1] += lab_stream_sum(m->data + lo, hi - lo, 1024);
        return;
    }
    if (j->halves) {
        int64_t lo, hi;
        lab_split(m->rows, ith, nth, 16, &lo, &hi);
        j->fn(m->data + (size_t)lo * m->rb, m->rb, hi - lo, m->cols, j->y + lo);
        return;
    }
    int64_t min_rows = (int64_t)((size_t)128 * 1024 / m->rb) / 16 * 16;
    if (min_rows < 16) min_rows = 16;
    for (int64_t lo, hi; lab_claim(&j->next, m->rows, nth, 2, min_rows, &lo, &hi);)
        j->fn(m->data + (size_t)lo * m->rb, m->rb, hi - lo, m->cols, j->y + lo);
}

typedef struct variant { const char *name; lab_gemv_fn fn; int halves; } variant;

static size_t row_bytes(int64_t cols) { return (size_t)cols * 2; }

int main(int argc, char **argv)
{
    int threads = 2, rounds = argc > 1 ? atoi(argv[1]) : 6;
    int nmat;
    size_t total;
    uint8_t *buf;
    mat *ms = lab_layout(row_bytes, &nmat, &total, &buf);
    for (size_t i = 0; i < total; i += 2) { /* bf16 values in [0.5, 2): exponent 0x3f, random mantissa */
        uint16_t v = (uint16_t)(0x3f00 | ((i * 2654435761u) >> 13 & 0xff));
        memcpy(buf + i, &v, 2);
    }
    for (int i = 0; i < FF; i++) xf[i] = 1e-3f * (float)(i * 37 % 2001 - 1000);
    for (int c = 0; c < FF; c += 32)
        for (int k = 0; k < 16; k++) xeo[c + k] = xf[c + 2 * k], xeo[c + 16 + k] = xf[c + 2 * k + 1];
    float *y = malloc(sizeof(float) * VOCAB), *yref = malloc(sizeof(float) * VOCAB);
    thread_pool *pool;
    pool_create(threads, &pool);
    variant all[] = {
        {"stream(probe loop) pf1k T0", NULL},
        {"8l pf1k T1 (backend)", g8_1k_t1},
        {"8l pf2k T1", g8_2k_t1},
        {"8l pf1k T0", g8_1k_t0},
        {"8l pf1k T1 even/odd", g8_1k_t1_eo},
        {"8l pf2k T1 even/odd", g8_2k_t1_eo},
        {"4l pf2k T1", g4_2k_t1},
        {"8l pf1k loads only", g8_1k_noar},
        {"16l pf512 T1", g16_512_t1},
        {"8l pf512 T1", g8_512_t1},
        {"2l pf4k T1", g2_4k_t1},
        {"8l no pf even/odd", g8_0_eo},
        {"4l pf4k T1 even/odd", g4_4k_t1_eo},
        {"1l pf1k T0 loads only", g1_1k_t0_noar},
        {"1l pf1k T0", g1_1k_t0},
        {"1l pf1k T0 even/odd", g1_1k_t0_eo},
        {"2l pf2k T0 even/odd", g2_2k_t0_eo},
        {"4l pf1k T0 even/odd", g4_1k_t0_eo},
        {"4l pf2k T1 even/odd", g4_2k_t1_eo},
        {"8l pf1k T1 halves", g8_1k_t1, 1},
        {"1l pf1k T0 loads halves", g1_1k_t0_noar, 1},
        {"1l pf1k T0 even/odd halves", g1_1k_t0_eo, 1},
        {"2l pf2k T1 even/odd", g2_2k_t1_eo},
        {"2l pf4k T0 even/odd", g2_4k_t0_eo},
        {"2l pf1k T0 even/odd", g2_1k_t0_eo},
        {"4l pf2k T0 even/odd", g4_2k_t0_eo},
        {"2l pf2k T0 even/odd 2acc", g2_2k_t0_eo2},
        {"4l pf2k T1 even/odd 2acc", g4_2k_t1_eo2},
        {"2l pf2k T0", g2_2k_t0},
        {"3l pf2k T0 even/odd 2acc", g3_2k_t0_eo2},
        {"4l pf2k T0 even/odd 2acc", g4_2k_t0_eo2},
        {"3l pf2k T1 even/odd 2acc", g3_2k_t1_eo2},
        {"4l pf3k T1 even/odd 2acc", g4_3k_t1_eo2},
        {"3l pf2k T1", g3_2k_t1},
        {"3l pf3k T0 even/odd 2acc", g3_3k_t0_eo2},
        {"4l pf1k T1 even/odd 2acc", g4_1k_t1_eo2},
        {"3l pf4k T0 even/odd 2acc", g3_4k_t0_eo2},
        {"3l pf3k T0", g3_3k_t0},
        {"3l pf3k T0 even/odd", g3_3k_t0_eo},
        {"2l pf3k T0 even/odd 2acc", g2_3k_t0_eo2},
        {"3l pf3k T1 even/odd 2acc", g3_3k_t1_eo2},
    };
    int nv = sizeof all / sizeof all[0];
    /* the even/odd kernel must compute what the backend's does (same products, other order) */
    {
        const mat *m = &ms[3];
        job a = {.m = m, .fn = g8_1k_t1, .y = yref}, b = {.m = m, .fn = g8_1k_t1_eo, .y = y};
        pool_run(pool, task, &a, threads);
        pool_run(pool, task, &b, threads);
        double md = 0;
        for (int64_t r = 0; r < m->rows; r++) {
            double d = (y[r] - yref[r]) / (1e-6 + (yref[r] < 0 ? -yref[r] : yref[r]));
            if (d < 0) d = -d;
            if (d > md) md = d;
        }
        printf("even/odd vs backend tile, ffn_gate: max rel diff %.2e\n", md);
    }
    int use[LAB_MAX_VARIANTS], nu = lab_variants(nv, use);
    if (rounds < 1 || rounds > LAB_MAX_ROUNDS) rounds = 6;
    static double gbs[LAB_MAX_VARIANTS][LAB_MAX_ROUNDS];
    for (int r = 0; r < rounds + 1; r++)
        for (int k = 0; k < nu; k++) {
            int v = use[(k + r) % nu]; /* the order rotated each round; round 0 warms up */
            double t0 = lab_now_s();
            for (int i = 0; i < nmat; i++) {
                job j = {.m = &ms[i], .fn = all[v].fn, .halves = all[v].halves, .y = y};
                pool_run(pool, task, &j, threads);
            }
            double t = lab_now_s() - t0;
            if (r > 0) gbs[v][r - 1] = (double)total / t / 1e9;
        }
    const char *names[LAB_MAX_VARIANTS];
    for (int i = 0; i < nv; i++) names[i] = all[i].name;
    lab_report(names, gbs, use, nu, rounds);
    return 0;
}

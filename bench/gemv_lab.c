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

#include "gemv_lab.h"

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

typedef struct job {
    const mat *m, *nextm; /* nextm: the matrix after this one (cross-boundary prefetch), or NULL */
    int ahead_kb;
    lab_gemv_fn fn; /* NULL: stream */
    int pf, guided, div, minkb, prime;
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
        size_t tail = (size_t)j->ahead_kb * 1024;
        if (j->nextm && (size_t)(hi - lo) > 2 * tail) {
            j->sink[ith & 1] += lab_stream_sum(m->data + lo, hi - lo - tail, j->pf);
            const mat *n = j->nextm;
            int64_t nb = (int64_t)(n->rows * n->rb), nlo, nhi;
            lab_split(nb, ith, nth, 256, &nlo, &nhi);
            for (int64_t o = 0; o < (int64_t)tail && nlo + o < nb; o += 64) _mm_prefetch((const char *)n->data + nlo + o, _MM_HINT_T1);
            j->sink[ith & 1] += lab_stream_sum(m->data + hi - tail, tail, j->pf);
            return;
        }
        j->sink[ith & 1] += lab_stream_sum(m->data + lo, hi - lo, j->pf);
        return;
    }
    if (!j->guided) {
        int64_t lo, hi;
        lab_split(m->rows, ith, nth, 16, &lo, &hi);
        j->fn(m->data + (size_t)lo * m->rb, m->rb, hi - lo, m->cols, j->y + lo, j->pf);
        return;
    }
    int64_t min_rows = (int64_t)((size_t)j->minkb * 1024 / m->rb) / 16 * 16;
    if (min_rows < 16) min_rows = 16;
    for (int64_t lo, hi; lab_claim(&j->next, m->rows, nth, j->div, min_rows, &lo, &hi);) {
        if (j->prime) { /* the first pf bytes of both lanes */
            const uint8_t *a = m->data + (size_t)lo * m->rb, *b = a + (size_t)((hi - lo) / 2) * m->rb;
            for (int o = 0; o < j->pf; o += 64) { _mm_prefetch((const char *)a + o, _MM_HINT_T1); _mm_prefetch((const char *)b + o, _MM_HINT_T1); }
        }
        j->fn(m->data + (size_t)lo * m->rb, m->rb, hi - lo, m->cols, j->y + lo, j->pf);
    }
}

typedef struct variant { const char *name; lab_gemv_fn fn; int pf, guided, div, minkb, prime, ahead_kb; } variant;

static size_t row_bytes(int64_t cols) { return (size_t)cols / 32 * 34; }

int main(int argc, char **argv)
{
    int threads = 2, rounds = argc > 1 ? atoi(argv[1]) : 6;
    int nmat;
    size_t total;
    uint8_t *buf;
    mat *ms = lab_layout(row_bytes, &nmat, &total, &buf);
    for (size_t i = 0; i < total; i++) buf[i] = (uint8_t)((i * 2654435761u) >> 13);
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
    int use[LAB_MAX_VARIANTS], nu = lab_variants(nv, use);
    if (rounds < 1 || rounds > LAB_MAX_ROUNDS) rounds = 6;
    static double gbs[LAB_MAX_VARIANTS][LAB_MAX_ROUNDS];
    for (int r = 0; r < rounds + 1; r++)
        for (int k = 0; k < nu; k++) {
            int v = use[(k + r) % nu]; /* rotate the order each round */
            double t0 = lab_now_s();
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
            double t = lab_now_s() - t0;
            if (r > 0) gbs[v][r - 1] = (double)total / t / 1e9;
        }
    const char *names[LAB_MAX_VARIANTS];
    for (int i = 0; i < nv; i++) names[i] = all[i].name;
    lab_report(names, gbs, use, nu, rounds);
    return 0;
}

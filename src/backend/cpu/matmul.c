/*
 * matmul.c — out = x W^T on the CPU, for every weight format, split over
 * the thread pool.
 *
 * Two shapes of work:
 *   few tokens (decode):  GEMV. Each thread streams its own contiguous slice
 *       of W's rows once; up to GEMV_MAX_TOKENS tokens share every weight
 *       load. Memory-bound: the aim is the bandwidth floor.
 *   many tokens (prefill): GEMM. Tokens are packed into groups of TW
 *       (token-minor, so a vector holds TW/2 tokens of one column), each
 *       thread dequantizes a block of its rows once into a float panel that
 *       stays in L2, and every token group is multiplied against that panel
 *       with the register-tiled micro-kernel. Weight decoding is paid once
 *       per block, not once per token.
 * Each output element is computed by one thread in a fixed order, so the
 * result does not depend on the thread count.
 */
#include "backend/cpu/cpu_internal.h"

#include "base/error.h"

#include <stdlib.h>

enum {
    GEMM_MIN_TOKENS = 8,         /* below this, GEMV re-reads W once per 4 tokens and wins */
    PANEL_BYTES = 384 * 1024,    /* dequantized rows per block: fits L2 next to a token group */
    SERIAL_BYTES = 128 * 1024,   /* matrices smaller than this run on one thread */
    ROW_ALIGN = 16,              /* thread slices start on multiples of this many rows */
};

void cpu_split(int64_t total, int64_t align, int ith, int nth, int64_t *lo, int64_t *hi)
{
    int64_t units = (total + align - 1) / align;
    int64_t a = units * ith / nth, b = units * (ith + 1) / nth;
    *lo = a * align < total ? a * align : total;
    *hi = b * align < total ? b * align : total;
}

/* ---- GEMV ---------------------------------------------------------------- */

typedef struct matmul_job {
    cpu_backend *cb;
    float *out;
    const float *x;
    const weight_ref *w;
    int n;
    size_t row_bytes;
    int64_t block_rows; /* GEMM: rows per dequantized panel */
} matmul_job;

static void gemv_task(void *arg, int ith, int nth)
{
    const matmul_job *j = arg;
    const weight_ref *w = j->w;
    int64_t lo, hi;
    cpu_split(w->rows, ROW_ALIGN, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    const uint8_t *base = (const uint8_t *)w->data + (size_t)lo * j->row_bytes;
    gemv_fn gemv = j->cb->k.gemv[w->dtype];
    for (int t0 = 0; t0 < j->n; t0 += GEMV_MAX_TOKENS) {
        int nt = j->n - t0 < GEMV_MAX_TOKENS ? j->n - t0 : GEMV_MAX_TOKENS;
        gemv(base, j->row_bytes, hi - lo, w->cols, j->x + (int64_t)t0 * w->cols, w->cols, nt,
             j->out + (int64_t)t0 * w->rows + lo, w->rows);
    }
}

/* ---- GEMM ---------------------------------------------------------------- */

static void pack_task(void *arg, int ith, int nth)
{
    const matmul_job *j = arg;
    int tw = j->cb->k.gemm_tokens;
    int groups = (j->n + tw - 1) / tw;
    int64_t cols = j->w->cols;
    for (int g = ith; g < groups; g += nth) {
        int nt = j->n - g * tw < tw ? j->n - g * tw : tw;
        cpu_pack_tokens(j->cb->packed + (int64_t)g * tw * cols, j->x + (int64_t)g * tw * cols, cols, nt, cols, tw);
    }
}

static void gemm_task(void *arg, int ith, int nth)
{
    const matmul_job *j = arg;
    const cpu_kernels *k = &j->cb->k;
    const weight_ref *w = j->w;
    int64_t cols = w->cols, lo, hi;
    int tw = k->gemm_tokens, groups = (j->n + tw - 1) / tw;
    cpu_split(w->rows, j->block_rows, ith, nth, &lo, &hi);
    for (int64_t r0 = lo; r0 < hi; r0 += j->block_rows) {
        int64_t nr = hi - r0 < j->block_rows ? hi - r0 : j->block_rows;
        const uint8_t *src = (const uint8_t *)w->data + (size_t)r0 * j->row_bytes;
        const float *panel = (const float *)src;
        if (w->dtype != SPARK_DTYPE_F32) {
            k->dequant[w->dtype](src, j->row_bytes, nr, cols, j->cb->panel[ith]);
            panel = j->cb->panel[ith];
        }
        for (int g = 0; g < groups; g++) {
            int nt = j->n - g * tw < tw ? j->n - g * tw : tw;
            k->gemm_tile(j->cb->packed + (int64_t)g * tw * cols, panel, cols, (int)nr, cols,
                         j->out + (int64_t)g * tw * w->rows + r0, w->rows, nt);
        }
    }
}

/* Grow the packed-token and per-thread panel buffers; 0 on allocation failure. */
static int ensure_gemm_scratch(cpu_backend *cb, size_t packed_floats, size_t panel_floats)
{
    if (packed_floats > cb->packed_cap) {
        free(cb->packed);
        cb->packed = aligned_alloc(64, ((packed_floats * sizeof(float)) + 63) & ~(size_t)63);
        cb->packed_cap = cb->packed ? packed_floats : 0;
        if (!cb->packed) return 0;
    }
    if (panel_floats > cb->panel_cap) {
        int nth = pool_size(cb->pool);
        for (int i = 0; i < nth; i++) {
            free(cb->panel[i]);
            cb->panel[i] = aligned_alloc(64, ((panel_floats * sizeof(float)) + 63) & ~(size_t)63);
            if (!cb->panel[i]) {
                cb->panel_cap = 0;
                return 0;
            }
        }
        cb->panel_cap = panel_floats;
    }
    return 1;
}

void cpu_matmul(backend *be, float *out, const float *x, const weight_ref *w, int n)
{
    cpu_backend *cb = cpu_of(be);
    matmul_job j = {.cb = cb, .out = out, .x = x, .w = w, .n = n,
                    .row_bytes = (size_t)dtype_row_bytes(w->dtype, (uint64_t)w->cols)};
    int nth = pool_size(cb->pool);
    if ((uint64_t)j.row_bytes * (uint64_t)w->rows < SERIAL_BYTES) nth = 1;
    if (n >= GEMM_MIN_TOKENS) {
        int tw = cb->k.gemm_tokens, tr = cb->k.gemm_rows;
        int64_t rows_fit = PANEL_BYTES / (w->cols * (int64_t)sizeof(float)) / tr * tr;
        j.block_rows = rows_fit > tr ? rows_fit : tr;
        size_t groups = (size_t)(n + tw - 1) / (size_t)tw;
        if (ensure_gemm_scratch(cb, groups * (size_t)tw * (size_t)w->cols, (size_t)j.block_rows * (size_t)w->cols)) {
            pool_run(cb->pool, pack_task, &j, pool_size(cb->pool));
            pool_run(cb->pool, gemm_task, &j, nth);
            return;
        }
        /* no memory for the GEMM scratch: the GEMV path needs none */
    }
    pool_run(cb->pool, gemv_task, &j, nth);
}

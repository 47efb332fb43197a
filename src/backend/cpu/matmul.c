/*
 * matmul.c — out = x W^T on the CPU, for every weight format, split over
 * the thread pool.
 *
 * Two shapes of work:
 *   few tokens (decode):  GEMV. Each thread streams its own contiguous slice
 *       of W's rows once; up to GEMV_MAX_TOKENS tokens share every weight
 *       load. Memory-bound: the aim is the bandwidth floor. One token of a
 *       Q8_0 / Q4_K / Q6_K matrix takes the int16-activation kernels where
 *       the level has them (cpu_kernels.x8; the K-quants' int8 ones with
 *       SPARK_KQUANT_X8=1).
 *   many tokens (prefill): GEMM. Tokens are packed into groups of TW
 *       (token-minor, so a vector holds TW/2 tokens of one column), each
 *       thread dequantizes a block of its rows (a column chunk at a time)
 *       into a float panel, and every token group is multiplied against
 *       that panel with the register-tiled micro-kernel. Weight decoding is
 *       paid once per block, not once per token; packed tokens are read
 *       once per block of BLOCK_TILES row tiles.
 * Each output element is computed by one thread in a fixed order, so the
 * result does not depend on the thread count.
 */
#include "backend/cpu/cpu_internal.h"

#include "base/error.h"

#include <stdatomic.h>
#include <stdlib.h>

enum {
    GEMM_MIN_TOKENS = 8,         /* below this, GEMV re-reads W once per 4 tokens and wins */
    GROUP_CHUNK_BYTES = 256 * 1024, /* a token group's column chunk: stays in L2 across a block */
    BLOCK_TILES = 8,             /* row tiles per block: the reuse of each token-group chunk */
    SERIAL_BYTES = 128 * 1024,   /* matrices smaller than this run on one thread */
    ROW_ALIGN = 16,              /* thread slices start on multiples of this many rows */
    GEMV_MIN_PIECE_BYTES = 128 * 1024, /* the shortest GEMV piece a thread claims */
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
    int64_t col_chunk;  /* GEMM: columns per panel (a multiple of 256: whole blocks) */
    int64_t chunks;     /* GEMM: row blocks, claimed in order through `next` */
    const q8x_block *xq; /* GEMV: x in int8 for the integer-domain kernel, or NULL */
    int x16;             /* GEMV: Q8_0 / Q4_K / Q6_K against x in int16 (cb->x16q, x16d, x16s) */
    _Atomic int64_t next;
} matmul_job;

/* Work is claimed piece by piece rather than split up front: on a machine
 * shared with other jobs a descheduled thread then delays the product by
 * one piece, not by its whole share. Which thread computes a row never
 * changes the row's arithmetic, so results stay identical. */
static int64_t claim(matmul_job *j) { return atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed); }

/* GEMV rows are claimed in shrinking pieces ("guided"): each claim takes
 * 1/(2 nth) of the rows still unclaimed (whole ROW_ALIGN groups, at least
 * GEMV_MIN_PIECE_BYTES of weights), so early pieces are long (few lane
 * restarts) and the last ones short: the threads finish within a short
 * piece of each other. With equal pieces (nth * 4 of them) one thread
 * idled for half a piece on average at the end of every product, ~4-6 % of
 * Q8_0 decode (spinning in the pool, perf; bench/RESULTS.md, 2026-11-30). */
static int claim_rows(matmul_job *j, int64_t rows, int nth, int64_t min_rows, int64_t *lo, int64_t *hi)
{
    int64_t cur = atomic_load_explicit(&j->next, memory_order_relaxed);
    for (;;) {
        if (cur >= rows) return 0;
        int64_t left = rows - cur, take = nth == 1 ? left : left / (2 * nth);
        take = (take + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
        if (take < min_rows) take = min_rows;
        if (take > left) take = left;
        if (atomic_compare_exchange_weak_explicit(&j->next, &cur, cur + take, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *lo = cur;
            *hi = cur + take;
            return 1;
        }
    }
}

static void gemv_task(void *arg, int ith, int nth)
{
    matmul_job *j = arg;
    const weight_ref *w = j->w;
    gemv_fn gemv = j->cb->k.gemv[w->dtype];
    int64_t min_rows = (int64_t)(GEMV_MIN_PIECE_BYTES / j->row_bytes) / ROW_ALIGN * ROW_ALIGN;
    if (min_rows < ROW_ALIGN) min_rows = ROW_ALIGN;
    for (int64_t lo, hi; claim_rows(j, w->rows, nth, min_rows, &lo, &hi);) {
        const uint8_t *base = (const uint8_t *)w->data + (size_t)lo * j->row_bytes;
        if (j->xq) {
            j->cb->k.x8.gemv[w->dtype](base, j->row_bytes, hi - lo, w->cols, j->xq, j->out + lo);
            continue;
        }
        if (j->x16) {
            j->cb->k.x8.gemv_x16[w->dtype](base, j->row_bytes, hi - lo, w->cols, j->cb->x16q, j->cb->x16d,
                                           j->cb->x16s, j->out + lo);
            continue;
        }
        for (int t0 = 0; t0 < j->n; t0 += GEMV_MAX_TOKENS) {
            int nt = j->n - t0 < GEMV_MAX_TOKENS ? j->n - t0 : GEMV_MAX_TOKENS;
            gemv(base, j->row_bytes, hi - lo, w->cols, j->x + (int64_t)t0 * w->cols, w->cols, nt,
                 j->out + (int64_t)t0 * w->rows + lo, w->rows);
        }
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

/* One panel: rows [r0, r0 + nr) x columns [c0, c0 + nc) of W as floats, with
 * row stride *ldw (F32 weights are used in place). */
static const float *load_panel(const matmul_job *j, int ith, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                               int64_t *ldw)
{
    const weight_ref *w = j->w;
    const uint8_t *src = (const uint8_t *)w->data + (size_t)r0 * j->row_bytes + dtype_row_bytes(w->dtype, (uint64_t)c0);
    if (w->dtype == SPARK_DTYPE_F32) {
        *ldw = w->cols;
        return (const float *)src;
    }
    j->cb->k.dequant[w->dtype](src, j->row_bytes, nr, nc, j->cb->panel[ith]);
    *ldw = nc;
    return j->cb->panel[ith];
}

/* Threads claim row blocks one at a time. Per block, the columns
 * go in chunks of col_chunk: the chunk of every token group (TW x col_chunk
 * floats) stays in L2 while all the block's row tiles use it, so packed
 * tokens are read from memory once per block_rows rows, not once per tile. */
static void gemm_task(void *arg, int ith, int nth)
{
    matmul_job *j = arg;
    const cpu_kernels *k = &j->cb->k;
    const weight_ref *w = j->w;
    int64_t cols = w->cols;
    int tw = k->gemm_tokens, groups = (j->n + tw - 1) / tw;
    for (int64_t blk; (blk = claim(j)) < j->chunks;) {
        int64_t r0 = blk * j->block_rows;
        int64_t nr = w->rows - r0 < j->block_rows ? w->rows - r0 : j->block_rows;
        for (int64_t c0 = 0; c0 < cols; c0 += j->col_chunk) {
            int64_t nc = cols - c0 < j->col_chunk ? cols - c0 : j->col_chunk, ldw;
            const float *panel = load_panel(j, ith, r0, nr, c0, nc, &ldw);
            for (int g = 0; g < groups; g++) {
                int nt = j->n - g * tw < tw ? j->n - g * tw : tw;
                k->gemm_tile(j->cb->packed + ((int64_t)g * cols + c0) * tw, panel, ldw, (int)nr, nc,
                             j->out + (int64_t)g * tw * w->rows + r0, w->rows, nt, c0 > 0);
            }
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

/* Grow the int16 activation buffers to `values` values; 0 on allocation failure. */
static int ensure_x16(cpu_backend *cb, size_t values)
{
    if (values <= cb->x16_cap) return 1;
    free(cb->x16q);
    free(cb->x16d);
    free(cb->x16s);
    cb->x16q = aligned_alloc(64, (values * sizeof(int16_t) + 63) & ~(size_t)63);
    cb->x16d = aligned_alloc(64, (values / 32 * sizeof(float) + 63) & ~(size_t)63);
    cb->x16s = aligned_alloc(64, (values / 32 * sizeof(float) + 63) & ~(size_t)63);
    cb->x16_cap = cb->x16q && cb->x16d && cb->x16s ? values : 0;
    return cb->x16_cap != 0;
}

/* Grow the int8 activation buffer to `blocks` blocks; 0 on allocation failure. */
static int ensure_xq(cpu_backend *cb, size_t blocks)
{
    if (blocks <= cb->xq_cap) return 1;
    free(cb->xq);
    cb->xq = aligned_alloc(64, blocks * sizeof(q8x_block));
    cb->xq_cap = cb->xq ? blocks : 0;
    return cb->xq != NULL;
}

void cpu_matmul(backend *be, float *out, const float *x, const weight_ref *w, int n)
{
    cpu_backend *cb = cpu_of(be);
    matmul_job j = {.cb = cb, .out = out, .x = x, .w = w, .n = n,
                    .row_bytes = (size_t)dtype_row_bytes(w->dtype, (uint64_t)w->cols)};
    int nth = pool_size(cb->pool);
    if ((uint64_t)j.row_bytes * (uint64_t)w->rows < SERIAL_BYTES) nth = 1;
    if (cpu_amx_matmul(cb, nth, out, x, w, n)) return; /* bf16 weights, enough tokens, AMX here */
    if (n >= GEMM_MIN_TOKENS) {
        int tw = cb->k.gemm_tokens, tr = cb->k.gemm_rows;
        j.block_rows = (int64_t)tr * BLOCK_TILES;
        j.col_chunk = GROUP_CHUNK_BYTES / ((int64_t)tw * (int64_t)sizeof(float)) / 256 * 256;
        if (j.col_chunk < 256) j.col_chunk = 256;
        if (j.col_chunk > w->cols) j.col_chunk = w->cols;
        size_t groups = (size_t)(n + tw - 1) / (size_t)tw;
        if (ensure_gemm_scratch(cb, groups * (size_t)tw * (size_t)w->cols, (size_t)j.block_rows * (size_t)j.col_chunk)) {
            pool_run(cb->pool, pack_task, &j, pool_size(cb->pool));
            j.chunks = (w->rows + j.block_rows - 1) / j.block_rows;
            pool_run(cb->pool, gemm_task, &j, nth);
            return;
        }
        /* no memory for the GEMM scratch: the GEMV path needs none */
    }
    /* One token of Q8_0, Q4_K or Q6_K: x rounded to int16 per 32 values once
     * here, not per row (more precise than the reference's bf16
     * activations; kernels.h), every row a sum of integer dot products
     * (kernels_x8.inc). K-quant blocks need whole 256-value blocks. */
    int blk = w->dtype == SPARK_DTYPE_Q8_0 ? 32 : 256;
    if (n == 1 && cb->k.x8.gemv_x16[w->dtype] && w->cols % blk == 0 && ensure_x16(cb, (size_t)w->cols)) {
        cb->k.x8.quant_x16(x, w->cols, cb->x16q, cb->x16d, cb->x16s);
        j.x16 = 1;
    } else if (n == 1 && cb->k.x8.gemv[w->dtype] && w->cols % 256 == 0 && ensure_xq(cb, w->cols / 256)) {
        /* the int8-activation K-quant kernels (SPARK_KQUANT_X8=1 only: below
         * SPEC section 2's precision; cpu_backend.c) */
        cb->k.x8.quant_x(w->dtype, x, w->cols, cb->xq);
        j.xq = cb->xq;
    }
    pool_run(cb->pool, gemv_task, &j, nth);
}

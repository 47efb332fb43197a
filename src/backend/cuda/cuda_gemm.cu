/*
 * cuda_gemm.cu — products of many tokens (a prompt's chunk): x as a bf16
 * hi + lo pair (written by x's producer, remembered for the next GEMM of the
 * same x, or split here), cuBLAS tensor-core GEMMs over bf16 weights and over
 * panels of other formats decoded to a bf16 pair, and the choice per product
 * between the fused GEMV (one token), the few-token GEMVs and these
 * (run_matmul). cuda_backend.cu's header says why each path is as exact as
 * it is.
 */
#include "backend/cuda/cuda_state.h"

namespace spark_cuda {

/* Where bf holds the pair of `count` floats: hi, then lo (with x_bf16, hi
 * alone, x rounded once). */
static cu_pair pair_in_bf(const cuda_backend *cb, size_t count)
{
    cu_pair pair = {cb->bf, cb->x_bf16 ? NULL : (char *)cb->bf + count * 2};
    return pair;
}

/* cb->bf made ready to hold the pair of the `count` floats at x. From here
 * on bf is x's pair until a command other than a GEMM runs (run_cmd,
 * pair_forget). */
static cu_pair pair_slot(cuda_backend *cb, const float *x, size_t count)
{
    scratch(&cb->bf, &cb->bf_bytes, count * 4);
    cb->pair_of = x;
    cb->pair_count = count;
    return pair_in_bf(cb, count);
}

/* The pair a producer of a prompt's rows writes beside its output (none
 * inside a decode step, whose products are GEMVs on x itself, and whose
 * capture may not allocate). */
cu_pair producer_pair(cuda_backend *cb, const cmd *c, const float *out, size_t count)
{
    cu_pair none = {NULL, NULL};
    if (!cb->pair_fuse || c->n == 1) return none;
    cb->pair_written++;
    return pair_slot(cb, out, count);
}

void pair_forget(cuda_backend *cb) { cb->pair_of = NULL; }

/* x (n rows of cols) as a bf16 pair in cb->bf: *hi, then *lo (NULL with
 * x_bf16). Usually x's producer wrote it already (its rmsnorm, gate_heads
 * or gelu_mul), or the GEMM before this one read the same x (qkv and the
 * head gates, gate and up): then there is nothing to do. */
static void split_x(cuda_backend *cb, const float *x, int64_t cols, int n, void **hi, void **lo)
{
    const size_t count = (size_t)n * (size_t)cols;
    cu_pair pair;
    if (cb->pair_of == x && cb->pair_count == count) {
        cb->pair_reused++;
        pair = pair_in_bf(cb, count);
    } else {
        cb->pair_splits++;
        pair = pair_slot(cb, x, count);
        CK(cu_split_bf16(cb->st, pair, x, (int64_t)count));
    }
    *hi = pair.hi, *lo = pair.lo;
}

/* A GEMM that writes over the floats whose pair bf holds makes that pair stale. */
void pair_check_output(cuda_backend *cb, const cmd *c)
{
    if (!cb->pair_of) return;
    const char *o0 = (const char *)c->out, *o1 = o0 + (size_t)c->n * (size_t)c->rows * sizeof(float);
    const char *x0 = (const char *)cb->pair_of, *x1 = x0 + cb->pair_count * sizeof(float);
    if (o0 < x1 && x0 < o1) pair_forget(cb);
}

/* out (+)= W . x on tensor cores, fp32 accumulation: W rows x cols and x n x
 * cols, both bf16, row-major; out n x ldo (its rows), fp32. */
static void gemm_ex(cuda_backend *cb, float *out, int64_t ldo, const void *W, const void *x, int64_t rows,
                    int64_t cols, int n, float beta)
{
    const float one = 1.0f;
    /* column-major view: out^T (rows x n) = W (cols x rows)^T . x^T (cols x n) */
    CKB(cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, n, (int)cols, &one, W, CUDA_R_16BF, (int)cols,
                     x, CUDA_R_16BF, (int)cols, &beta, out, CUDA_R_32F, (int)ldo, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT));
}

/* The most tokens a product runs as GEMVs (weights streamed once per
 * CUDA_GEMV_MAX_TOKENS) rather than as a GEMM. */
static int gemv_limit(const cuda_backend *cb, int dtype)
{
    if (cb->gemv_tokens > 0) return cb->gemv_tokens;
    /* where the GEMVs stop beating the (stacked) GEMMs for the 4B on an H100 (run 26) */
    switch (dtype) {
    case SPARK_DTYPE_Q8_0: return 5;
    case SPARK_DTYPE_Q4_K: return 2;
    case SPARK_DTYPE_Q4_0:
    case SPARK_DTYPE_Q6_K: return 1; /* the GEMM won from 2 tokens by 2x against the file-layout GEMV (run 31) */
    default: return 3;
    }
}

/* The most tokens whose product is one stacked GEMM (gemm_stacked). A block
 * format's stacked GEMM computes a fourth product, which pays only while
 * the panel's reads cost more than its arithmetic (run 26: up to ~128). */
static int stack_limit(const cuda_backend *cb, int dtype)
{
    if (cb->stack_tokens >= 0) return cb->stack_tokens;
    return dtype == SPARK_DTYPE_BF16 ? STACK_TOKENS : STACK_TOKENS / 2;
}

/* out (rows apart per token) = the sum of W's parts_r row blocks (rows
 * each, contiguous) times x hi + x lo (contiguous, as split_x leaves them):
 * one GEMM of 2n columns, so W streams once where separate products would
 * read it once per term; what a product of a few tokens costs is that
 * stream (bench/cuda_runs.md run 26). */
static void gemm_stacked(cuda_backend *cb, float *out, int64_t ldo, const void *W, const void *hi, int64_t rows,
                         int parts_r, int64_t cols, int n)
{
    const int64_t wide_rows = parts_r * rows;
    float *wide = (float *)scratch((void **)&cb->wide, &cb->wide_bytes, (size_t)wide_rows * 2 * (size_t)n * 4);
    gemm_ex(cb, wide, wide_rows, W, hi, wide_rows, cols, 2 * n, 0.0f);
    CK(cu_fold_products(cb->st, out, ldo, wide, rows, n, parts_r));
}

/* bf16 weights, many tokens: x = hi + lo, two tensor-core products (one
 * stacked GEMM for a few tokens); with x_bf16 one, x rounded as the
 * reference rounds it (SPEC §2). */
static void gemm_bf16(cuda_backend *cb, float *out, const float *x, const void *W, int64_t rows, int64_t cols, int n)
{
    void *hi, *lo;
    split_x(cb, x, cols, n, &hi, &lo);
    if (!lo) { /* x_bf16: one product */
        cb->x_bf16_products++;
        gemm_ex(cb, out, rows, W, hi, rows, cols, n, 0.0f);
        return;
    }
    if (n <= stack_limit(cb, SPARK_DTYPE_BF16)) {
        cb->stacked_products++;
        gemm_stacked(cb, out, rows, W, hi, rows, 1, cols, n);
        return;
    }
    gemm_ex(cb, out, rows, W, hi, rows, cols, n, 0.0f);
    gemm_ex(cb, out, rows, W, lo, rows, cols, n, 1.0f);
}

/* Any other format, many tokens: panels of rows decoded to a bf16 pair
 * (W = Wh + Wl to ~2^-16, exact for f16) and three tensor-core GEMMs,
 * Wh xh + Wh xl + Wl xh (the dropped Wl xl is ~2^-18 of the product), or
 * for a few tokens all four as one stacked GEMM (with x_bf16: Wh x + Wl x,
 * the weights still exact); or,
 * with SPARK_CUDA_QGEMM=f32 (and for f32 weights), SGEMM on float32
 * panels: fp32 products of the decoded values, 1.6x (512 tokens) to 2.3x
 * (8k) slower for the 4B on an H100 (bench/cuda_runs.md run 25). */
static void gemm_panels(cuda_backend *cb, const cmd *c)
{
    const float one = 1.0f, zero = 0.0f;
    int64_t rows = c->rows, cols = c->cols;
    if (c->dtype == SPARK_DTYPE_F32) {
        CKB(cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, c->n, (int)cols, &one, (const float *)c->w,
                        (int)cols, c->x, (int)cols, &zero, c->out, (int)rows));
        return;
    }
    int64_t per = (int64_t)(PANEL_BYTES / ((size_t)cols * 4)); /* 4 bytes a weight either way */
    if (per < 1) per = 1;
    if (per > rows) per = rows;
    char *panel = (char *)scratch(&cb->panel, &cb->panel_bytes, (size_t)per * (size_t)cols * 4);
    void *xh = NULL, *xl = NULL;
    if (!cb->qgemm_f32) split_x(cb, c->x, cols, c->n, &xh, &xl);
    const int stacked = !cb->qgemm_f32 && xl && c->n <= stack_limit(cb, c->dtype);
    cb->stacked_products += stacked;
    cb->x_bf16_products += !cb->qgemm_f32 && !xl;
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        int64_t pr = rows - r0 < per ? rows - r0 : per;
        if (cb->qgemm_f32) {
            CK(cu_dequant_rows(cb->st, (float *)panel, c->w, c->dtype, r0, pr, cols, c->row_bytes));
            CKB(cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)pr, c->n, (int)cols, &one, (float *)panel,
                            (int)cols, c->x, (int)cols, &zero, c->out + r0, (int)rows));
            continue;
        }
        char *wh = panel, *wl = panel + (size_t)pr * (size_t)cols * 2;
        CK(cu_dequant_rows_bf16x2(cb->st, wh, wl, c->w, c->dtype, r0, pr, cols, c->row_bytes));
        if (stacked) { /* all four products, the panel read once */
            gemm_stacked(cb, c->out + r0, rows, wh, xh, pr, 2, cols, c->n);
            continue;
        }
        gemm_ex(cb, c->out + r0, rows, wh, xh, pr, cols, c->n, 0.0f);
        if (xl) gemm_ex(cb, c->out + r0, rows, wh, xl, pr, cols, c->n, 1.0f);
        gemm_ex(cb, c->out + r0, rows, wl, xh, pr, cols, c->n, 1.0f);
    }
}

/* A product: the fused GEMV for one token, GEMVs for a few, else a GEMM. */
void run_matmul(cuda_backend *cb, const cmd *c)
{
    cudaStream_t st = cb->st;
    if (c->n == 1 && cb->fast && cu_fgemv_ok(c->dtype, c->cols, c->row_bytes, c->w, c->rows) &&
        ((uintptr_t)c->x % 16) == 0) {
        cu_fgemv_args a = fgemv_of_matmul(c);
        CK(cu_fgemv(st, &a, cb->sms, cb->pdl_now));
    } else if (c->n <= gemv_limit(cb, c->dtype)) { /* stream the weights once per 4 tokens */
        cb->gemv_products += c->n > 1;
        for (int t0 = 0; t0 < c->n; t0 += CUDA_GEMV_MAX_TOKENS) {
            int nt = c->n - t0 < CUDA_GEMV_MAX_TOKENS ? c->n - t0 : CUDA_GEMV_MAX_TOKENS;
            CK(cu_gemv(st, c->out + (int64_t)t0 * c->rows, c->x + (int64_t)t0 * c->cols, c->w, c->dtype, c->rows,
                       c->cols, c->row_bytes, nt));
        }
    } else if (c->dtype == SPARK_DTYPE_BF16) {
        cb->gemm_products++;
        gemm_bf16(cb, c->out, c->x, c->w, c->rows, c->cols, c->n);
    } else {
        cb->gemm_products++;
        gemm_panels(cb, c);
    }
}

} // namespace spark_cuda

/*
 * test_amx.c — the AMX prefill product (src/backend/cpu/amx.c) against a
 * float64 product of the same bf16 weights and float32 activations.
 *
 * Bound, per output element: |got - sum w x| <= AMX_TOL * sum |w x| with
 * AMX_TOL = 2e-7 (ten times tighter than the float path's DOT_TOL in
 * test_kernels.c; measured worst 9.5e-8 over these shapes). The activations are
 * split into three bf16 parts, x = x0 + x1 + x2, exact for float32 values
 * in bf16's exponent range; what remains is the tile unit's float32
 * accumulation. The test has teeth: it also measures the product with x0
 * alone (bf16 activations) and with x0 + x1 (two parts), and requires both
 * to exceed AMX_TOL, so a dropped part fails.
 * Edges: rows, columns and tokens that are not multiples of the tiles.
 * Results must be bit-identical with 1 and 2 threads.
 */
#include "check.h"
#include "test_random.h"

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/threadpool.h"
#include "io/dtype.h"

#include <stdint.h>
#include <stdlib.h>

#define AMX_TOL 2e-7


static void check_shape(cpu_backend *cb, int64_t rows, int64_t cols, int n)
{
    uint16_t *w = malloc((size_t)rows * cols * 2);
    float *x = malloc((size_t)n * cols * 4), *y1 = malloc((size_t)n * rows * 4), *y2 = malloc((size_t)n * rows * 4);
    for (int64_t i = 0; i < rows * cols; i++) w[i] = f32_to_bf16((float)(uniform_d() * 0.1));
    for (int64_t i = 0; i < n * cols; i++) x[i] = (float)(uniform_d() * (1.0 + 3.0 * (i % 5 == 0)));
    weight_ref wr = {.name = "test", .dtype = SPARK_DTYPE_BF16, .rows = rows, .cols = cols, .data = w};
    CHECK(cpu_amx_matmul(cb, 1, y1, x, &wr, n));
    CHECK(cpu_amx_matmul(cb, 2, y2, x, &wr, n));
    CHECK_MSG(!memcmp(y1, y2, (size_t)n * rows * 4), "rows %lld cols %lld n %d: 1 and 2 threads differ",
              (long long)rows, (long long)cols, n);
    double worst = 0, worst_hi_only = 0, worst_two = 0;
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0, a = 0, h = 0, h2 = 0;
            for (int64_t c = 0; c < cols; c++) {
                const double wv = bf16_to_f32(w[r * cols + c]), xv = x[(int64_t)t * cols + c];
                const float x0 = bf16_to_f32(f32_to_bf16((float)xv)), x1 = bf16_to_f32(f32_to_bf16((float)xv - x0));
                s += wv * xv;
                a += fabs(wv * xv);
                h += wv * x0;
                h2 += wv * ((double)x0 + x1);
            }
            const double e = fabs(y1[(int64_t)t * rows + r] - s) / (a > 0 ? a : 1);
            const double eh = fabs(h - s) / (a > 0 ? a : 1);
            if (e > worst) worst = e;
            if (eh > worst_hi_only) worst_hi_only = eh;
            const double e2 = fabs(h2 - s) / (a > 0 ? a : 1);
            if (e2 > worst_two) worst_two = e2;
        }
    CHECK_MSG(worst <= AMX_TOL, "rows %lld cols %lld n %d: error %.3g x sum|wx| (bound %.3g)", (long long)rows,
              (long long)cols, n, worst, AMX_TOL);
    CHECK_MSG(worst_hi_only > AMX_TOL && worst_two > AMX_TOL,
              "rows %lld cols %lld n %d: one / two parts err only %.3g / %.3g: no teeth", (long long)rows,
              (long long)cols, n, worst_hi_only, worst_two);
    printf("  rows %5lld cols %5lld n %3d: worst %.3g x sum|wx| (one part %.3g, two %.3g)\n", (long long)rows,
           (long long)cols, n, worst, worst_hi_only, worst_two);
    free(w);
    free(x);
    free(y1);
    free(y2);
}

static backend *be;

/* Shapes in an order that reuses the backend's activation buffer with less
 * padding than before (stale values there would show as errors). */
static void test_amx_matches_float64(void)
{
    cpu_backend *cb = cpu_of(be);
    check_shape(cb, 300, 2560, 100);
    check_shape(cb, 16, 32, 16);
    check_shape(cb, 37, 70, 16);
    check_shape(cb, 64, 1000, 17);
    check_shape(cb, 128, 256, 33);
    check_shape(cb, 130, 1056, 64);
    check_shape(cb, 37, 70, 19);
}

static void test_amx_declines_other_inputs(void)
{
    float x[16 * 32] = {0}, y[16 * 16];
    uint8_t w[16 * 32 * 4] = {0};
    weight_ref wr = {.name = "f32", .dtype = SPARK_DTYPE_F32, .rows = 16, .cols = 32, .data = w};
    CHECK(!cpu_amx_matmul(cpu_of(be), 1, y, x, &wr, 16)); /* float32 weights: the float path */
    wr.dtype = SPARK_DTYPE_BF16;
    CHECK(!cpu_amx_matmul(cpu_of(be), 1, y, x, &wr, AMX_MIN_TOKENS - 1)); /* too few tokens */
}


int main(void)
{
    if (backend_cpu_create(2, &be) != SPARK_OK) return 1;
    if (!cpu_amx_available()) {
        printf("SKIP test_amx_matches_float64: no AMX-BF16 here (or SPARK_AMX=0)\n");
    } else {
        RUN(test_amx_matches_float64);
    }
    RUN(test_amx_declines_other_inputs);
    be->ops->destroy(be);
    CHECK_EXIT();
}

/*
 * test_engine.c — direct tests of the pieces of the forward pass that a
 * logit comparison on random weights can miss: the window predicate (which
 * keys a query sees, through ring wrap and chunk boundaries), rope's formula
 * and untouched tail dims, and that each layer class gets its own rope.
 */
#include "check.h"

#include "engine/session.h"

#include <stdlib.h>

enum { D = 32, MAX_POS = 24 };

/* One head, q = 0 so every visible key gets the same weight, v_j = e_j:
 * the output of query p is 1/|visible| on exactly the visible positions. */
static void run_visibility(int window, int slots, const int *chunks, int n_chunks)
{
    backend *be;
    CHECK(backend_cpu_create(1, &be) == SPARK_OK);
    attn_shape sh = {.n_head = 1, .n_head_kv = 1, .head_dim = D, .qkv_stride = 3 * D, .scale = 1.0f};
    kv_layer kv = {.slots = slots, .window = window};
    kv.k = calloc((size_t)slots * D, sizeof(float));
    kv.v = calloc((size_t)slots * D, sizeof(float));
    float *qkv = calloc((size_t)MAX_POS * 3 * D, sizeof(float));
    float *out = calloc((size_t)MAX_POS * D, sizeof(float));
    int64_t pos = 0;
    for (int c = 0; c < n_chunks; c++) {
        int n = chunks[c];
        for (int t = 0; t < n; t++) {
            float *row = qkv + (int64_t)t * 3 * D;
            for (int d = 0; d < 3 * D; d++) row[d] = 0;
            row[2 * D + (pos + t)] = 1.0f; /* v = e_position */
            row[D + 0] = 0.0f;             /* k = 0: scores all equal */
        }
        be->ops->attention(be, out, qkv, &kv, pos, n, &sh);
        be->ops->kv_store(be, &kv, qkv, pos, n, &sh);
        for (int t = 0; t < n; t++) {
            int64_t p = pos + t;
            int visible = 0;
            for (int64_t j = 0; j <= p; j++) visible += window == 0 || (p - j >= 0 && p - j < window);
            for (int64_t j = 0; j < MAX_POS && j < D; j++) {
                int should = j <= p && (window == 0 || (0 <= p - j && p - j < window));
                float want = should ? 1.0f / (float)visible : 0.0f;
                CHECK_MSG(fabsf(out[(int64_t)t * D + j] - want) < 1e-6f,
                          "window %d, query %lld, key %lld: weight %g, expected %g", window, (long long)p,
                          (long long)j, out[(int64_t)t * D + j], want);
            }
        }
        pos += n;
    }
    free(kv.k);
    free(kv.v);
    free(qkv);
    free(out);
    be->ops->destroy(be);
}

static void test_window_predicate_decode(void)
{
    int ones[MAX_POS];
    for (int i = 0; i < MAX_POS; i++) ones[i] = 1;
    run_visibility(4, 4, ones, MAX_POS); /* the ring wraps five times */
}

static void test_window_predicate_chunks(void)
{
    int chunks[] = {3, 5, 1, 7, 2, 6}; /* chunks longer than the window too */
    run_visibility(4, 4, chunks, 6);
    run_visibility(5, 5, chunks, 6);
}

static void test_full_layer_sees_everything(void)
{
    int chunks[] = {4, 1, 9, 10};
    run_visibility(0, MAX_POS, chunks, 4);
}

static void test_rope_formula(void)
{
    backend *be;
    CHECK(backend_cpu_create(1, &be) == SPARK_OK);
    enum { HD = 12, R = 8, HEADS = 2 };
    float x[HEADS * HD], orig[HEADS * HD];
    for (int i = 0; i < HEADS * HD; i++) x[i] = orig[i] = (float)(0.1 * (i + 1) * (i % 3 == 0 ? -1 : 1));
    rope_class rc = {.rot_dims = R, .theta = 500.0};
    int64_t pos = 7;
    be->ops->rope(be, x, 1, HEADS * HD, HEADS, HD, pos, &rc);
    for (int h = 0; h < HEADS; h++) {
        const float *o = orig + h * HD;
        const float *y = x + h * HD;
        for (int j = 0; j < R / 2; j++) {
            double angle = (double)pos * pow(500.0, -2.0 * j / R);
            double a = o[j], b = o[j + R / 2];
            CHECK_NEAR(y[j], a * cos(angle) - b * sin(angle), 1e-6);
            CHECK_NEAR(y[j + R / 2], b * cos(angle) + a * sin(angle), 1e-6);
        }
        for (int d = R; d < HD; d++) CHECK(y[d] == o[d]); /* past the rotary dims: untouched */
    }
    be->ops->destroy(be);
}

/* A session over a config-only model: rope_for_layer must follow each
 * layer's own class, and the two classes must differ in dims and theta. */
static void test_rope_per_layer_class(void)
{
    uint8_t kinds[] = {SPARK_LAYER_SLIDING, SPARK_LAYER_FULL, SPARK_LAYER_SLIDING, SPARK_LAYER_FULL};
    spark_model m = {0};
    m.cfg = (spark_model_config){.n_embd = 8, .n_ff = 8, .n_layer = 4, .n_head = 2, .n_head_kv = 1, .head_dim = 8,
                                 .n_vocab = 4, .max_ctx = 16, .sliding_window = 4, .rms_eps = 1e-6f,
                                 .rope_theta_full = 5e6f, .rope_theta_sliding = 1e4f, .rope_dim_full = 2,
                                 .rope_dim_sliding = 8, .layer_kind = kinds};
    spark_session *s;
    CHECK(spark_session_create(&m, NULL, &s) == SPARK_OK);
    for (int i = 0; i < 4; i++) {
        const rope_class *rc = rope_for_layer(s, i);
        if (kinds[i] == SPARK_LAYER_FULL) {
            CHECK(rc->rot_dims == 2 && rc->theta == 5e6);
        } else {
            CHECK(rc->rot_dims == 8 && rc->theta == 1e4);
        }
    }
    /* the ring of a sliding layer has exactly `window` slots; a full layer n_ctx */
    CHECK(s->kv[0].slots == 4 && s->kv[0].window == 4);
    CHECK(s->kv[1].slots == 16 && s->kv[1].window == 0);
    spark_session_free(s);
}

/* The FFN activation is the exact erf GELU: the tanh approximation differs
 * by up to ~5e-4 (near |x| = 2), far outside this tolerance. */
static void test_gelu_is_erf_not_tanh(void)
{
    backend *be;
    CHECK(backend_cpu_create(1, &be) == SPARK_OK);
    enum { N = 801 };
    float a[N], b[N];
    for (int i = 0; i < N; i++) {
        a[i] = -8.0f + 0.02f * i;
        b[i] = 1.0f;
    }
    be->ops->gelu_mul(be, a, b, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double x = -8.0 + 0.02 * (float)i, x32 = (float)x;
        double want = 0.5 * x32 * (1 + erf(x32 / sqrt(2.0)));
        double err = fabs(a[i] - want);
        worst = err > worst ? err : worst;
    }
    CHECK_MSG(worst < 2e-6, "gelu max error %g", worst);
    be->ops->destroy(be);
}

int main(void)
{
    RUN(test_window_predicate_decode);
    RUN(test_window_predicate_chunks);
    RUN(test_full_layer_sees_everything);
    RUN(test_rope_formula);
    RUN(test_rope_per_layer_class);
    RUN(test_gelu_is_erf_not_tanh);
    CHECK_EXIT();
}

/*
 * test_session.c — the session API on the trained spark-tiny model
 * (models/spark-tiny, window 64): rewinding past a wrapped sliding ring
 * gives the logits of never having gone further (to float32 rounding); the context
 * limit is a clean error that changes nothing; reset starts over.
 */
#include "check.h"

#include "spark.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MODEL "models/spark-tiny"
enum { N = 300 };

static int32_t ids[N];
static spark_model *model;

static float *eval_fresh(const int32_t *tokens, int n, int32_t vocab)
{
    spark_session *s;
    float *logits = malloc((size_t)vocab * sizeof(float));
    CHECK(spark_session_create(model, NULL, &s) == SPARK_OK);
    CHECK(spark_session_eval(s, tokens, n, logits, 0) == SPARK_OK);
    spark_session_free(s);
    return logits;
}

/* Rewind 130 tokens back: with no slack the session re-evaluates from 0,
 * with 160 slack slots the rings still hold the window; both must equal a
 * fresh evaluation of the same tokens. */
static void rewind_case(int32_t n_rewind)
{
    int32_t vocab = spark_model_get_config(model)->n_vocab;
    spark_session *s;
    float *got = malloc((size_t)vocab * sizeof(float));
    spark_session_options o = spark_session_default_options();
    o.n_rewind = n_rewind;
    CHECK(spark_session_create(model, &o, &s) == SPARK_OK);
    CHECK(spark_session_eval(s, ids, N, NULL, 0) == SPARK_OK); /* the 64-slot rings wrap ~4 times */
    CHECK(spark_session_rewind(s, 170) == SPARK_OK);
    CHECK(spark_session_pos(s) == 170);
    /* continue differently from position 170 */
    int32_t other[40];
    for (int i = 0; i < 40; i++) other[i] = (ids[i] * 7 + 3) % vocab;
    CHECK(spark_session_eval(s, other, 40, got, 0) == SPARK_OK);
    int32_t *joined = malloc((170 + 40) * sizeof(int32_t));
    memcpy(joined, ids, 170 * sizeof(int32_t));
    memcpy(joined + 170, other, 40 * sizeof(int32_t));
    float *want = eval_fresh(joined, 210, vocab);
    /* equal up to float32 rounding: the optimised kernels may sum in another
     * order for other chunk sizes (300 + refill + 40 here, 210 at once there) */
    double diff = 0, norm = 0;
    for (int32_t v = 0; v < vocab; v++) {
        diff += ((double)got[v] - want[v]) * ((double)got[v] - want[v]);
        norm += (double)want[v] * want[v];
    }
    CHECK_MSG(sqrt(diff / norm) < 1e-5, "relative L2 %g", sqrt(diff / norm));
    CHECK(memcmp(spark_session_tokens(s), joined, 210 * sizeof(int32_t)) == 0);
    CHECK(spark_session_rewind(s, 211) == SPARK_ERR_ARG);
    free(joined);
    free(want);
    free(got);
    spark_session_free(s);
}

static void test_rewind_past_a_wrapped_ring(void) { rewind_case(0); }
static void test_rewind_within_the_ring_slack(void) { rewind_case(160); }

static void test_context_limit_changes_nothing(void)
{
    spark_session_options o = spark_session_default_options();
    o.n_ctx = 100;
    spark_session *s;
    CHECK(spark_session_create(model, &o, &s) == SPARK_OK);
    CHECK(spark_session_eval(s, ids, 90, NULL, 0) == SPARK_OK);
    CHECK(spark_session_eval(s, ids, 11, NULL, 0) == SPARK_ERR_CONTEXT);
    CHECK_ERROR_MENTIONS("context of 100");
    CHECK(spark_session_pos(s) == 90);
    int32_t bad = 1 << 30;
    CHECK(spark_session_eval(s, &bad, 1, NULL, 0) == SPARK_ERR_ARG);
    CHECK(spark_session_pos(s) == 90);
    spark_session_reset(s);
    CHECK(spark_session_pos(s) == 0);
    o.n_ctx = spark_model_get_config(model)->max_ctx + 1;
    spark_session *too_big = NULL;
    CHECK(spark_session_create(model, &o, &too_big) == SPARK_ERR_ARG && too_big == NULL);
    spark_session_free(s);
}

int main(void)
{
    if (spark_model_load(MODEL, &model) != SPARK_OK) {
        printf("FAIL load %s: %s\n", MODEL, spark_last_error());
        return 1;
    }
    int32_t vocab = spark_model_get_config(model)->n_vocab;
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 2654435761u) % (uint32_t)(vocab - 20)) + 14;
    RUN(test_rewind_past_a_wrapped_ring);
    RUN(test_rewind_within_the_ring_slack);
    RUN(test_context_limit_changes_nothing);
    spark_model_free(model);
    CHECK_EXIT();
}

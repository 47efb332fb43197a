/*
 * test_session.c — the session API on the trained spark-tiny model
 * (models/spark-tiny, window 64): rewinding past a wrapped sliding ring
 * gives the logits of never having gone further (to float32 rounding); the context
 * limit is a clean error that changes nothing; reset starts over; greedy
 * spark_generate without a tokenizer gives the ids that stepping the logits
 * by hand does, and leaves the cache as if the last id was never fed.
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

/* The greedy rule, written out here: the first index of the largest finite-or-+inf value. */
static int32_t first_max(const float *x, int32_t n)
{
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > -INFINITY && (best < 0 || x[i] > x[best])) best = i;
    return best;
}

typedef struct id_list {
    int32_t id[64];
    int n;
} id_list;

static int collect(void *user, int32_t id, const char *text, size_t len)
{
    id_list *l = user;
    CHECK(text && len == 0);
    if (l->n < 64) l->id[l->n++] = id;
    return 0;
}

/* n greedy ids after prompt[0..np) by hand: eval, argmax, eval the id, ... */
static void greedy_by_hand(const int32_t *prompt, int np, int n, int32_t *out)
{
    int32_t vocab = spark_model_get_config(model)->n_vocab;
    float *logits = malloc((size_t)vocab * sizeof(float));
    spark_session *s;
    CHECK(spark_session_create(model, NULL, &s) == SPARK_OK);
    CHECK(spark_session_eval(s, prompt, np, logits, 0) == SPARK_OK);
    for (int i = 0; i < n; i++) {
        out[i] = first_max(logits, vocab);
        if (i + 1 < n) CHECK(spark_session_eval(s, &out[i], 1, logits, 0) == SPARK_OK);
    }
    spark_session_free(s);
    free(logits);
}

static void test_greedy_generate_without_tokenizer(void)
{
    enum { NP = 20, NG = 40 };
    int32_t want[NG];
    greedy_by_hand(ids, NP, NG, want);
    spark_sampler_params sp = spark_sampler_default_params();
    sp.temperature = 0;
    spark_sampler *greedy;
    CHECK(spark_sampler_create(&sp, spark_model_get_config(model)->n_vocab, &greedy) == SPARK_OK);
    spark_session *s;
    CHECK(spark_session_create(model, NULL, &s) == SPARK_OK);
    id_list got = {.n = 0};
    spark_generate_params gp = {.max_tokens = NG, .ignore_eos = 1, .on_token = collect, .user = &got};
    spark_generate_result r;
    CHECK(spark_generate(s, NULL, greedy, ids, NP, &gp, &r) == SPARK_OK);
    CHECK(r.finish == SPARK_FINISH_LENGTH && r.n_generated == NG && got.n == NG);
    CHECK(memcmp(got.id, want, sizeof want) == 0);
    CHECK(spark_session_pos(s) == NP + NG - 1); /* the last id is not fed */

    /* a stop id ends it early; the cache then holds the prompt and the ids
     * before the stop, and continues exactly like a fresh evaluation */
    int k = 0; /* the first place the id at 17 occurs */
    while (want[k] != want[17]) k++;
    spark_session_reset(s);
    got.n = 0;
    gp.stop_ids = &want[k];
    gp.n_stop_ids = 1;
    CHECK(spark_generate(s, NULL, greedy, ids, NP, &gp, &r) == SPARK_OK);
    CHECK_MSG(r.finish == SPARK_FINISH_EOS && r.n_generated == k + 1, "finish %d after %d", r.finish, r.n_generated);
    CHECK(spark_session_pos(s) == NP + k);
    int32_t vocab = spark_model_get_config(model)->n_vocab;
    float *a = malloc((size_t)vocab * sizeof(float));
    int32_t next = 77;
    CHECK(spark_session_eval(s, &next, 1, a, 0) == SPARK_OK);
    int32_t joined[NP + NG + 1];
    memcpy(joined, ids, NP * sizeof(int32_t));
    memcpy(joined + NP, want, (size_t)k * sizeof(int32_t));
    joined[NP + k] = next;
    CHECK(memcmp(spark_session_tokens(s), joined, (size_t)(NP + k + 1) * sizeof(int32_t)) == 0);
    float *b = eval_fresh(joined, NP + k + 1, vocab);
    double diff = 0, norm = 0;
    for (int32_t v = 0; v < vocab; v++) {
        diff += ((double)a[v] - b[v]) * ((double)a[v] - b[v]);
        norm += (double)b[v] * b[v];
    }
    CHECK_MSG(sqrt(diff / norm) < 1e-5, "relative L2 %g", sqrt(diff / norm));

    /* no tokenizer, no stop strings */
    const char *stop = "x";
    gp.stop = &stop;
    gp.n_stop = 1;
    CHECK(spark_generate(s, NULL, greedy, ids, 2, &gp, &r) == SPARK_ERR_ARG);
    CHECK_ERROR_MENTIONS("tokenizer");
    free(a);
    free(b);
    spark_session_free(s);
    spark_sampler_free(greedy);
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
    RUN(test_greedy_generate_without_tokenizer);
    spark_model_free(model);
    CHECK_EXIT();
}

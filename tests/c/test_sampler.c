/*
 * test_sampler.c — the sampler against distributions computed here by a
 * deliberately plain method (full sort, double softmax), with chi-square
 * tests over many draws; greedy, seeding, penalties, bias and bad params.
 */
#include "check.h"

#include "spark.h"

#include <stdlib.h>
#include <string.h>

enum { V = 8, DRAWS = 40000 };

static const float base_logits[V] = {2.0f, 1.5f, 1.4f, 0.3f, -0.2f, -1.0f, 0.9f, -3.0f};

/* Reference: HF order — temperature, top-k, top-p, min-p — by full sort. */
static void reference_probs(const float *logits, float temp, int top_k, float top_p, float min_p, double *p)
{
    int order[V];
    double x[V], max = -1e300, z = 0;
    for (int i = 0; i < V; i++) {
        order[i] = i;
        x[i] = (double)logits[i] / temp;
    }
    for (int i = 0; i < V; i++) /* insertion sort, descending, ties by id */
        for (int j = i; j > 0 && x[order[j]] > x[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int keep = top_k > 0 && top_k < V ? top_k : V;
    for (int i = 0; i < keep; i++) max = x[order[i]] > max ? x[order[i]] : max;
    for (int i = 0; i < keep; i++) z += exp(x[order[i]] - max);
    double mass = 0;
    int kept_p = 0;
    while (kept_p < keep && (kept_p == 0 || mass < top_p)) mass += exp(x[order[kept_p++]] - max) / z;
    keep = kept_p;
    double pmax = exp(x[order[0]] - max);
    for (int i = 0; i < V; i++) p[i] = 0;
    double total = 0;
    for (int i = 0; i < keep; i++) {
        double w = exp(x[order[i]] - max);
        if (w < min_p * pmax) continue;
        p[order[i]] = w;
        total += w;
    }
    for (int i = 0; i < V; i++) p[i] /= total;
}

/* Chi-square critical value at p = 1e-4 (Wilson-Hilferty). */
static double chi2_critical(int df)
{
    double z = 3.719, a = 2.0 / (9.0 * df);
    double c = 1 - a + z * sqrt(a);
    return df * c * c * c;
}

static void check_distribution(spark_sampler_params params, const double *want, const char *what)
{
    spark_sampler *s;
    CHECK(spark_sampler_create(&params, V, &s) == SPARK_OK);
    int counts[V] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int32_t id = spark_sampler_sample(s, base_logits);
        CHECK(id >= 0 && id < V);
        if (id >= 0 && id < V) counts[id]++;
    }
    double chi2 = 0;
    int df = -1;
    for (int i = 0; i < V; i++) {
        if (want[i] == 0) {
            CHECK_MSG(counts[i] == 0, "%s: token %d drawn %d times but should be excluded", what, i, counts[i]);
            continue;
        }
        double e = want[i] * DRAWS;
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
        df++;
    }
    if (df > 0) CHECK_MSG(chi2 < chi2_critical(df), "%s: chi2 %.1f >= %.1f (df %d)", what, chi2, chi2_critical(df), df);
    spark_sampler_free(s);
}

static spark_sampler_params params(float temp, int top_k, float top_p, float min_p)
{
    spark_sampler_params p = spark_sampler_default_params();
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.seed = 1234;
    return p;
}

static void test_distributions(void)
{
    struct { float t; int k; float p, m; const char *name; } cases[] = {
        {1.0f, 0, 1.0f, 0.0f, "plain softmax"},  {0.7f, 0, 1.0f, 0.0f, "temperature 0.7"},
        {1.6f, 0, 1.0f, 0.0f, "temperature 1.6"}, {1.0f, 3, 1.0f, 0.0f, "top-k 3"},
        {1.0f, 0, 0.8f, 0.0f, "top-p 0.8"},       {1.0f, 0, 1.0f, 0.2f, "min-p 0.2"},
        {0.8f, 5, 0.9f, 0.05f, "combined"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double want[V];
        reference_probs(base_logits, cases[i].t, cases[i].k, cases[i].p, cases[i].m, want);
        check_distribution(params(cases[i].t, cases[i].k, cases[i].p, cases[i].m), want, cases[i].name);
    }
}

static void test_greedy_is_argmax(void)
{
    spark_sampler_params p = params(0, 0, 1, 0);
    spark_sampler *s;
    CHECK(spark_sampler_create(&p, V, &s) == SPARK_OK);
    CHECK(spark_sampler_sample(s, base_logits) == 0);
    float tie[V] = {0, 5, 1, 5, 0, 0, 0, 0};
    CHECK(spark_sampler_sample(s, tie) == 1); /* ties go to the lowest id */
    spark_sampler_free(s);
}

static void draw_sequence(uint64_t seed, int32_t *out, int n)
{
    spark_sampler_params p = params(1.0f, 0, 0.95f, 0);
    p.seed = seed;
    spark_sampler *s;
    CHECK(spark_sampler_create(&p, V, &s) == SPARK_OK);
    for (int i = 0; i < n; i++) out[i] = spark_sampler_sample(s, base_logits);
    spark_sampler_free(s);
}

static void test_seed_reproducible(void)
{
    int32_t a[200], b[200], c[200];
    draw_sequence(42, a, 200);
    draw_sequence(42, b, 200);
    draw_sequence(43, c, 200);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
}

/* Penalties change exactly the accepted tokens, by the documented formulas. */
static void test_penalties(void)
{
    spark_sampler_params p = params(1.0f, 0, 1.0f, 0);
    p.repeat_penalty = 1.3f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.3f;
    p.penalty_last_n = 3;
    spark_sampler *s;
    CHECK(spark_sampler_create(&p, V, &s) == SPARK_OK);
    int32_t accepted[] = {4, 1, 1, 5}; /* window 3: the 4 leaves, 1 twice, 5 once */
    for (int i = 0; i < 4; i++) spark_sampler_accept(s, accepted[i]);
    float expect[V];
    for (int i = 0; i < V; i++) expect[i] = base_logits[i];
    expect[1] = base_logits[1] / 1.3f - 0.5f - 0.3f * 2;  /* positive: divided */
    expect[5] = base_logits[5] * 1.3f - 0.5f - 0.3f * 1;  /* negative: multiplied */
    double want[V];
    reference_probs(expect, 1.0f, 0, 1.0f, 0.0f, want);
    int counts[V] = {0};
    for (int i = 0; i < DRAWS; i++) counts[spark_sampler_sample(s, base_logits)]++;
    double chi2 = 0;
    for (int i = 0; i < V; i++) chi2 += (counts[i] - want[i] * DRAWS) * (counts[i] - want[i] * DRAWS) / (want[i] * DRAWS);
    CHECK_MSG(chi2 < chi2_critical(V - 1), "penalised distribution: chi2 %.1f", chi2);
    spark_sampler_free(s);
}

static void test_logit_bias_bans(void)
{
    spark_logit_bias bias[] = {{0, -INFINITY}, {1, -INFINITY}, {2, 10.0f}};
    spark_sampler_params p = params(0, 0, 1, 0);
    p.logit_bias = bias;
    p.n_logit_bias = 3;
    spark_sampler *s;
    CHECK(spark_sampler_create(&p, V, &s) == SPARK_OK);
    CHECK(spark_sampler_sample(s, base_logits) == 2);
    spark_sampler_free(s);
    spark_logit_bias all[V];
    for (int i = 0; i < V; i++) all[i] = (spark_logit_bias){i, -INFINITY};
    p = params(1, 0, 1, 0);
    p.logit_bias = all;
    p.n_logit_bias = V;
    CHECK(spark_sampler_create(&p, V, &s) == SPARK_OK);
    CHECK(spark_sampler_sample(s, base_logits) == -1);
    spark_sampler_free(s);
}

static void test_bad_params(void)
{
    spark_sampler *s = NULL;
    spark_sampler_params bad[] = {params(-1, 0, 1, 0), params(NAN, 0, 1, 0), params(1, -2, 1, 0),
                                  params(1, 0, 0, 0),  params(1, 0, 1.5f, 0), params(1, 0, NAN, 0),
                                  params(1, 0, 1, -0.1f)};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(spark_sampler_create(&bad[i], V, &s) == SPARK_ERR_ARG);
        CHECK(s == NULL);
    }
    spark_sampler_params p = params(1, 0, 1, 0);
    p.repeat_penalty = 0;
    CHECK(spark_sampler_create(&p, V, &s) == SPARK_ERR_ARG);
    spark_logit_bias out_of_range = {V, 1.0f};
    p = params(1, 0, 1, 0);
    p.logit_bias = &out_of_range;
    p.n_logit_bias = 1;
    CHECK(spark_sampler_create(&p, V, &s) == SPARK_ERR_ARG);
    CHECK_ERROR_MENTIONS("outside the vocabulary");
}

/* A big vocabulary: top-p with a flat tail must still be exact. */
static void test_top_p_large_vocab(void)
{
    enum { BIG = 50000 };
    float *logits = malloc(BIG * sizeof(float));
    for (int i = 0; i < BIG; i++) logits[i] = (float)(-0.0001 * i);
    spark_sampler_params p = params(1.0f, 0, 0.5f, 0);
    spark_sampler *s;
    CHECK(spark_sampler_create(&p, BIG, &s) == SPARK_OK);
    /* mass is nearly uniform: the kept head holds ~half the vocabulary */
    double z = 0, mass = 0;
    for (int i = 0; i < BIG; i++) z += exp(-0.0001 * i);
    int cutoff = 0;
    while (mass < 0.5) mass += exp(-0.0001 * cutoff++) / z;
    int max_id = 0;
    for (int i = 0; i < 4000; i++) {
        int32_t id = spark_sampler_sample(s, logits);
        if (id > max_id) max_id = id;
    }
    CHECK_MSG(max_id < cutoff && max_id > cutoff * 9 / 10, "max id %d, cutoff %d", max_id, cutoff);
    spark_sampler_free(s);
    free(logits);
}

/* Top-p on a 5000-token vocabulary with a peaked head, the kept set from a
 * full sort here: every draw is inside it, and every member with at least
 * 0.5 % of the kept mass shows up (the quickselect cut is exactly the
 * shortest head holding top_p of the mass, never a token more or less). */
static void test_top_p_cut_matches_a_full_sort(void)
{
    enum { N = 5000, DRAWN = 20000 };
    float *logits = malloc(N * sizeof(float));
    int *order = malloc(N * sizeof(int)), *seen = calloc(N, sizeof(int)), *keep = calloc(N, sizeof(int));
    uint64_t x = 99;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        logits[i] = (float)((double)(x >> 40) / (double)(1 << 24) * 12.0) - 6.0f; /* uniform in [-6, 6) */
        order[i] = i;
    }
    for (float top_p = 0.3f; top_p < 1.0f; top_p += 0.3f) {
        for (int i = 1; i < N; i++) /* insertion sort, descending, ties by id */
            for (int j = i; j > 0 && (logits[order[j]] > logits[order[j - 1]] ||
                                      (logits[order[j]] == logits[order[j - 1]] && order[j] < order[j - 1]));
                 j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        double max = logits[order[0]], z = 0, mass = 0, kept_mass = 0;
        for (int i = 0; i < N; i++) z += exp((double)logits[i] - max);
        int kept = 0;
        while (kept < N && (kept == 0 || mass < top_p * z)) mass += exp((double)logits[order[kept++]] - max);
        memset(keep, 0, N * sizeof(int));
        memset(seen, 0, N * sizeof(int));
        for (int i = 0; i < kept; i++) keep[order[i]] = 1;
        kept_mass = mass;
        spark_sampler_params p = params(1.0f, 0, top_p, 0);
        spark_sampler *s;
        CHECK(spark_sampler_create(&p, N, &s) == SPARK_OK);
        for (int i = 0; i < DRAWN; i++) {
            int32_t id = spark_sampler_sample(s, logits);
            CHECK_MSG(id >= 0 && id < N && keep[id], "top_p %.1f: drew %d, outside the %d kept", top_p, id, kept);
            if (id >= 0 && id < N) seen[id]++;
        }
        int missing = 0;
        for (int i = 0; i < kept; i++)
            if (exp((double)logits[order[i]] - max) / kept_mass >= 0.005 && !seen[order[i]]) missing++;
        CHECK_MSG(missing == 0, "top_p %.1f: %d of the %d kept never drawn", top_p, missing, kept);
        CHECK_MSG(kept > 5, "top_p %.1f keeps only %d: the case cannot tell a cut one off", top_p, kept);
        spark_sampler_free(s);
    }
    free(logits);
    free(order);
    free(seen);
    free(keep);
}

int main(void)
{
    RUN(test_distributions);
    RUN(test_greedy_is_argmax);
    RUN(test_seed_reproducible);
    RUN(test_penalties);
    RUN(test_logit_bias_bans);
    RUN(test_bad_params);
    RUN(test_top_p_large_vocab);
    RUN(test_top_p_cut_matches_a_full_sort);
    CHECK_EXIT();
}

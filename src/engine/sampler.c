/*
 * sampler.c — choosing the next token from raw logits: logit bias,
 * repetition / presence / frequency penalties, temperature, top-k, top-p,
 * min-p, and a seeded generator that gives the same draws on every machine.
 *
 * Nothing sorts the whole vocabulary per token: min-p is a threshold test,
 * top-k a quickselect, and top-p sorts only the head of the distribution,
 * growing it (x4) until it holds top_p of the mass.
 */
#include "spark.h"

#include "base/error.h"
#include "base/mem.h"
#include "engine/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct candidate {
    float logit;
    int32_t id;
} candidate;

struct spark_sampler {
    spark_sampler_params p;
    spark_logit_bias *bias;   /* (n_logit_bias) own copy */
    int32_t n_vocab;
    uint64_t rng[4];          /* xoshiro256** state */
    int32_t *history;         /* ring of the last penalty_last_n accepted ids */
    int64_t n_history;        /* ids accepted so far */
    int32_t history_cap;
    int32_t *counts;          /* (n_vocab) occurrences inside the window */
    float *work;              /* (n_vocab) logits after bias and penalties */
    candidate *cand;          /* (n_vocab) */
};

/* ---- random numbers: splitmix64 seeding, xoshiro256** ------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

/* ---- parameters ----------------------------------------------------------- */

spark_sampler_params spark_sampler_default_params(void)
{
    return (spark_sampler_params){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                  .repeat_penalty = 1.0f, .penalty_last_n = 64, .seed = 0};
}

static spark_status check_params(const spark_sampler_params *p)
{
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return spark_fail(SPARK_ERR_ARG, "temperature must be a finite number >= 0 (got %g)", p->temperature);
    if (p->top_k < 0) return spark_fail(SPARK_ERR_ARG, "top_k must be >= 0 (got %d)", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return spark_fail(SPARK_ERR_ARG, "top_p must be in (0, 1] (got %g)", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return spark_fail(SPARK_ERR_ARG, "min_p must be in [0, 1] (got %g)", p->min_p);
    if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty))
        return spark_fail(SPARK_ERR_ARG, "repeat penalty must be a finite number > 0 (got %g)", p->repeat_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return spark_fail(SPARK_ERR_ARG, "presence/frequency penalties must be finite");
    if (p->penalty_last_n < -1) return spark_fail(SPARK_ERR_ARG, "penalty window must be >= -1");
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].id < 0 || isnan(p->logit_bias[i].bias))
            return spark_fail(SPARK_ERR_ARG, "logit bias %d: id %d / bias %g is invalid", i, p->logit_bias[i].id,
                              p->logit_bias[i].bias);
    return SPARK_OK;
}

spark_status spark_sampler_create(const spark_sampler_params *params, int32_t n_vocab, spark_sampler **out)
{
    *out = NULL;
    spark_sampler_params p = params ? *params : spark_sampler_default_params();
    TRY(check_params(&p));
    if (n_vocab <= 0) return spark_fail(SPARK_ERR_ARG, "sampler: vocabulary size %d", n_vocab);
    for (int32_t i = 0; i < p.n_logit_bias; i++)
        if (p.logit_bias[i].id >= n_vocab)
            return spark_fail(SPARK_ERR_ARG, "logit bias for id %d: outside the vocabulary of %d",
                              p.logit_bias[i].id, n_vocab);
    spark_sampler *s = spark_calloc(1, sizeof *s, "sampler");
    if (!s) return SPARK_ERR_NOMEM;
    s->p = p;
    s->n_vocab = n_vocab;
    s->history_cap = p.penalty_last_n > 0 ? p.penalty_last_n : 0;
    s->bias = spark_calloc((size_t)p.n_logit_bias, sizeof *s->bias, "logit bias");
    s->history = spark_calloc((size_t)s->history_cap, sizeof(int32_t), "sampler history");
    s->counts = spark_calloc((size_t)n_vocab, sizeof(int32_t), "sampler counts");
    s->work = spark_calloc((size_t)n_vocab, sizeof(float), "sampler logits");
    s->cand = spark_calloc((size_t)n_vocab, sizeof(candidate), "sampler candidates");
    if (!s->bias || !s->history || !s->counts || !s->work || !s->cand) {
        spark_sampler_free(s);
        return SPARK_ERR_NOMEM;
    }
    if (p.n_logit_bias) memcpy(s->bias, p.logit_bias, (size_t)p.n_logit_bias * sizeof *s->bias);
    s->p.logit_bias = s->bias;
    spark_sampler_reset(s, p.seed);
    *out = s;
    return SPARK_OK;
}

void spark_sampler_free(spark_sampler *s)
{
    if (!s) return;
    free(s->bias);
    free(s->history);
    free(s->counts);
    free(s->work);
    free(s->cand);
    free(s);
}

void spark_sampler_reset(spark_sampler *s, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    memset(s->counts, 0, (size_t)s->n_vocab * sizeof(int32_t));
    s->n_history = 0;
}

void spark_sampler_accept(spark_sampler *s, int32_t id)
{
    if (id < 0 || id >= s->n_vocab || s->p.penalty_last_n == 0) return;
    if (s->history_cap > 0) {
        int32_t slot = (int32_t)(s->n_history % s->history_cap);
        if (s->n_history >= s->history_cap) s->counts[s->history[slot]]--; /* leaves the window */
        s->history[slot] = id;
    }
    s->counts[id]++;
    s->n_history++;
}

/* ---- the steps ------------------------------------------------------------ */

static void apply_bias_and_penalties(spark_sampler *s, const float *logits)
{
    const spark_sampler_params *p = &s->p;
    memcpy(s->work, logits, (size_t)s->n_vocab * sizeof(float));
    for (int32_t i = 0; i < p->n_logit_bias; i++) s->work[p->logit_bias[i].id] += p->logit_bias[i].bias;
    int penalise = p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (!penalise || s->n_history == 0) return;
    for (int32_t id = 0; id < s->n_vocab; id++) {
        int32_t c = s->counts[id];
        if (!c) continue;
        float x = s->work[id];
        x = x > 0 ? x / p->repeat_penalty : x * p->repeat_penalty;
        s->work[id] = x - p->presence_penalty - p->frequency_penalty * (float)c;
    }
}

int32_t greedy_pick(const float *x, int32_t count)
{
    int32_t best = -1;
    for (int32_t i = 0; i < count; i++)
        if (x[i] > -INFINITY && (best < 0 || x[i] > x[best])) best = i;
    return best;
}

/* Larger logit first; ties broken by the smaller id, so results never
 * depend on the sort's implementation. */
static int cand_before(const candidate *a, const candidate *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *a, const void *b)
{
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* Move the m best candidates to c[0..m) (any order): quickselect. */
static void select_best(candidate *c, int32_t n, int32_t m)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        candidate pivot = c[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (cand_before(&c[i], &pivot)) i++;
            while (cand_before(&pivot, &c[j])) j--;
            if (i <= j) {
                candidate t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (m - 1 <= j) hi = j;
        else if (m - 1 >= i) lo = i;
        else break;
    }
}

/* Candidates after temperature, min-p and top-k, in no particular order;
 * returns their count. */
static int32_t gather_candidates(spark_sampler *s)
{
    const spark_sampler_params *p = &s->p;
    float inv_t = 1.0f / p->temperature;
    int32_t best = greedy_pick(s->work, s->n_vocab);
    if (best < 0) return 0;
    float floor = p->min_p > 0 ? s->work[best] * inv_t + logf(p->min_p) : -INFINITY;
    int32_t n = 0;
    for (int32_t id = 0; id < s->n_vocab; id++) {
        float x = s->work[id] * inv_t;
        if (x > -INFINITY && x >= floor) s->cand[n++] = (candidate){x, id};
    }
    if (p->top_k > 0 && p->top_k < n) {
        select_best(s->cand, n, p->top_k);
        n = p->top_k;
    }
    return n;
}

/* Keep the smallest prefix (descending) whose mass reaches top_p, sorting
 * only a growing head of the candidates. Returns the kept count. */
static int32_t apply_top_p(spark_sampler *s, int32_t n, double max_logit, double total)
{
    double target = s->p.top_p * total;
    for (int32_t head = n < 64 ? n : 64;; head = head * 4 < n ? head * 4 : n) {
        select_best(s->cand, n, head);
        qsort(s->cand, (size_t)head, sizeof *s->cand, cand_cmp);
        double mass = 0;
        for (int32_t i = 0; i < head; i++) {
            if (mass >= target) return i > 0 ? i : 1; /* mass before token i already reached top_p */
            mass += exp((double)s->cand[i].logit - max_logit);
        }
        if (head == n) return n;
    }
}

int spark_sampler_plain_greedy(const spark_sampler *s)
{
    const spark_sampler_params *p = &s->p;
    return p->temperature == 0 && p->n_logit_bias == 0 && p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
           p->frequency_penalty == 0.0f;
}

int32_t spark_sampler_sample(spark_sampler *s, const float *logits)
{
    apply_bias_and_penalties(s, logits);
    if (s->p.temperature == 0) return greedy_pick(s->work, s->n_vocab);
    int32_t n = gather_candidates(s);
    if (n == 0) return -1;
    double max_logit = -INFINITY, total = 0;
    for (int32_t i = 0; i < n; i++)
        if (s->cand[i].logit > max_logit) max_logit = s->cand[i].logit;
    for (int32_t i = 0; i < n; i++) total += exp((double)s->cand[i].logit - max_logit);
    if (s->p.top_p < 1.0f) {
        n = apply_top_p(s, n, max_logit, total);
        total = 0;
        for (int32_t i = 0; i < n; i++) total += exp((double)s->cand[i].logit - max_logit);
    }
    double r = rng_uniform(s->rng) * total, acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += exp((double)s->cand[i].logit - max_logit);
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[n - 1].id; /* r landed on the rounding slack at the very end */
}

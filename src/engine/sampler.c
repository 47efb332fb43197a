/*
 * sampler.c — choosing the next token from raw logits: logit bias,
 * repetition / presence / frequency penalties, temperature, top-k, top-p,
 * min-p, and a seeded generator that gives the same draws on every machine.
 *
 * Nothing sorts the vocabulary per token: min-p is a threshold test, top-k
 * a quickselect (its k winners then put in id order), top-p a pass over
 * quarter-nat buckets plus a weighted quickselect inside the bucket the cut
 * falls in, and each candidate's exp is computed once. With the recommended
 * settings (temperature 1, top-p 0.95, top-k off) on a 131072-token
 * vocabulary that is ~1.4-2.7 ms a token on the development VM, where
 * sorting a growing head cost 6-25 ms (bench/cuda_runs.md run 11).
 */
#include "spark.h"

#include "base/error.h"
#include "base/mem.h"
#include "engine/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct candidate {
    float logit;
    int32_t id;
    double weight; /* exp(logit - the largest), once computed */
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
    candidate *spare;         /* (n_vocab) sort_by_id's other buffer */
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
    s->spare = spark_calloc((size_t)n_vocab, sizeof(candidate), "sampler candidates");
    if (!s->bias || !s->history || !s->counts || !s->work || !s->cand || !s->spare) {
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
    free(s->spare);
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

/* The logits after bias and penalties: `logits` itself when neither
 * changes anything (no copy of the vocabulary), else s->work. */
static const float *apply_bias_and_penalties(spark_sampler *s, const float *logits)
{
    const spark_sampler_params *p = &s->p;
    int penalise = (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) &&
                   s->n_history > 0;
    if (!penalise && p->n_logit_bias == 0) return logits;
    memcpy(s->work, logits, (size_t)s->n_vocab * sizeof(float));
    for (int32_t i = 0; i < p->n_logit_bias; i++) s->work[p->logit_bias[i].id] += p->logit_bias[i].bias;
    if (!penalise) return s->work;
    for (int32_t id = 0; id < s->n_vocab; id++) {
        int32_t c = s->counts[id];
        if (!c) continue;
        float x = s->work[id];
        x = x > 0 ? x / p->repeat_penalty : x * p->repeat_penalty;
        s->work[id] = x - p->presence_penalty - p->frequency_penalty * (float)c;
    }
    return s->work;
}

/* The largest value first (eight independent chains, no index carried, so
 * the compiler can use max instructions; NaN never wins a >), then the first
 * index holding it. */
int32_t greedy_pick(const float *x, int32_t count)
{
    float m8[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int32_t i = 0;
    for (; i + 8 <= count; i += 8)
        for (int k = 0; k < 8; k++) m8[k] = x[i + k] > m8[k] ? x[i + k] : m8[k];
    float m = -INFINITY;
    for (; i < count; i++) m = x[i] > m ? x[i] : m;
    for (int k = 0; k < 8; k++) m = m8[k] > m ? m8[k] : m;
    if (!(m > -INFINITY)) return -1;
    for (i = 0; i < count; i++)
        if (x[i] == m) return i;
    return -1;
}

/* Larger logit first; ties broken by the smaller id, so results never
 * depend on the sort's implementation. */
static int cand_before(const candidate *a, const candidate *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
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

/* Candidates after temperature and min-p, in id order; returns their count. */
static int32_t gather_candidates(spark_sampler *s, const float *w)
{
    const spark_sampler_params *p = &s->p;
    float inv_t = 1.0f / p->temperature;
    int32_t best = greedy_pick(w, s->n_vocab);
    if (best < 0) return 0;
    float floor = p->min_p > 0 ? w[best] * inv_t + logf(p->min_p) : -INFINITY;
    int32_t n = 0;
    for (int32_t id = 0; id < s->n_vocab; id++) {
        float x = w[id] * inv_t;
        if (x > -INFINITY && x >= floor) s->cand[n++] = (candidate){x, id, 0.0};
    }
    return n;
}

static void swap_cand(candidate *a, candidate *b)
{
    candidate t = *a;
    *a = *b;
    *b = t;
}

/* Top-p: move the shortest head (in cand_before order) whose weight reaches
 * `target` to c[0..kept), in no particular order, and return kept (>= 1).
 * A quickselect on weight: partition around a pivot and keep to the side
 * that holds the cut, so a flat distribution (most of the vocabulary kept)
 * costs a few passes, not a sort. Invariant: c[0..lo) are kept, all better
 * than c[lo..n), their weight `kept` < target; the cut is in [lo, hi). */
static int32_t top_p_head(candidate *c, int32_t n, double target)
{
    int32_t lo = 0, hi = n;
    double kept = 0;
    uint32_t lcg = 0x9E3779B9u; /* pivots from a fixed sequence: the same choice on every run */
    while (hi - lo > 1) {
        lcg = lcg * 1664525u + 1013904223u;
        swap_cand(&c[lo + (int32_t)(lcg % (uint32_t)(hi - lo))], &c[hi - 1]);
        const candidate pivot = c[hi - 1];
        int32_t m = lo;
        double better = 0;
        for (int32_t i = lo; i < hi - 1; i++)
            if (cand_before(&c[i], &pivot)) {
                better += c[i].weight;
                swap_cand(&c[i], &c[m++]);
            }
        swap_cand(&c[m], &c[hi - 1]); /* [lo, m) better than the pivot at m, (m, hi) worse */
        if (kept + better >= target) {
            hi = m;
            continue;
        }
        kept += better + c[m].weight;
        if (kept >= target) return m + 1;
        lo = m + 1;
    }
    return hi;
}

static int id_cmp(const void *a, const void *b)
{
    int32_t x = ((const candidate *)a)->id, y = ((const candidate *)b)->id;
    return (x > y) - (x < y);
}

/* c[0..n) in id order (a qsort when short, else three 11-bit radix passes):
 * the weights are then summed, and the draw walks, in an order that does
 * not depend on how the selections above left the array, so any way of
 * finding the same candidates (this file's, a backend's prefilter) gives
 * the same token. */
static void sort_by_id(spark_sampler *s, candidate *c, int32_t n)
{
    if (n <= 4096) {
        qsort(c, (size_t)n, sizeof *c, id_cmp);
        return;
    }
    candidate *from = c, *to = s->spare;
    for (int shift = 0; shift < 33; shift += 11) {
        int32_t at[2048] = {0};
        for (int32_t i = 0; i < n; i++) at[((uint32_t)from[i].id >> shift) & 2047]++;
        for (int32_t d = 0, sum = 0; d < 2048; d++) {
            int32_t k = at[d];
            at[d] = sum;
            sum += k;
        }
        for (int32_t i = 0; i < n; i++) to[at[((uint32_t)from[i].id >> shift) & 2047]++] = from[i];
        candidate *t = from;
        from = to;
        to = t;
    }
    memcpy(c, from, (size_t)n * sizeof *c); /* three passes end in the spare buffer */
}

/* Each candidate's weight (once: the top-p cut and the draw reuse it) and
 * their sum; with `mass`, also each CAND_BUCKET's sum (for top_p_keep). */
static double weigh(candidate *c, int32_t n, double max_logit, double *mass)
{
    double total = 0;
    const float x_max = (float)max_logit;
    for (int32_t i = 0; i < n; i++) {
        c[i].weight = exp((double)c[i].logit - max_logit);
        total += c[i].weight;
        if (mass) mass[CAND_BUCKET(x_max, c[i].logit)] += c[i].weight;
    }
    return total;
}

/* Top-p over c[0..n) in id order, kept in id order: the shortest head (in
 * cand_before order) whose weight reaches target. Candidates go by buckets
 * (CAND_BUCKET: quarter-nats below x_max, so every bucket is better than
 * the next) summed in id order; the buckets before the one the cut falls in
 * are kept whole, the cut inside it comes from top_p_head on its members
 * alone, and one pass keeps what is at least as good as the cut's last
 * member. A flat distribution thus costs two passes, not a sort. Returns
 * the kept count. */
static int32_t top_p_keep(spark_sampler *s, candidate *c, int32_t n, float x_max, const double *mass, double target,
                          double *kept_total)
{
    double above = 0;
    int cut = 0;
    while (cut < CAND_BUCKETS - 1 && above + mass[cut] < target) above += mass[cut++];
    candidate *in = s->spare;
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (CAND_BUCKET(x_max, c[i].logit) == cut) in[m++] = c[i];
    int32_t k = m ? top_p_head(in, m, target - above) : 0; /* (m = 0: rounding put the target past all: keep all) */
    candidate last = in[0];
    for (int32_t i = 1; i < k; i++)
        if (cand_before(&last, &in[i])) last = in[i];
    int32_t kept = 0;
    double total = 0;
    for (int32_t i = 0; i < n; i++) {
        int b = CAND_BUCKET(x_max, c[i].logit);
        if (m == 0 || b < cut || (b == cut && !cand_before(&last, &c[i]))) {
            total += c[i].weight;
            c[kept++] = c[i];
        }
    }
    *kept_total = total;
    return kept;
}

/* The steps after the candidates are gathered (s->cand[0..n), in id order,
 * after temperature and min-p): top-k, top-p, the draw. complete: they are
 * every candidate; else only those above some threshold, total_all then
 * the weight exp(x - max) of every candidate, and SAMPLER_MORE is returned
 * (nothing drawn) when they cannot decide the token. */
static int32_t finish(spark_sampler *s, int32_t n, int complete, double total_all)
{
    const spark_sampler_params *p = &s->p;
    candidate *c = s->cand;
    if (n == 0) return complete ? -1 : SAMPLER_MORE;
    int top_k = p->top_k > 0 && p->top_k < n;
    if (!complete && !top_k && (p->top_k > 0 || p->top_p >= 1.0f)) return SAMPLER_MORE; /* they need them all */
    if (top_k) {
        select_best(c, n, p->top_k);
        n = p->top_k;
        sort_by_id(s, c, n);
    }
    double max_logit = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (c[i].logit > max_logit) max_logit = c[i].logit;
    double mass[CAND_BUCKETS] = {0};
    double total = weigh(c, n, max_logit, p->top_p < 1.0f ? mass : NULL);
    if (p->top_p < 1.0f) {
        double target = p->top_p * (complete || top_k ? total : total_all);
        if (!complete && !top_k && total < target) return SAMPLER_MORE; /* the head is longer than what came */
        n = top_p_keep(s, c, n, (float)max_logit, mass, target, &total);
    }
    double r = rng_uniform(s->rng) * total, acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += c[i].weight;
        if (r < acc) return c[i].id;
    }
    return c[n - 1].id; /* r landed on the rounding slack at the very end */
}

/* No bias and no penalty configured: the raw logits decide (what a
 * backend's pick or candidates need). */
static int unbiased(const spark_sampler_params *p)
{
    return p->n_logit_bias == 0 && p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
           p->frequency_penalty == 0.0f;
}

int spark_sampler_plain_greedy(const spark_sampler *s) { return s->p.temperature == 0 && unbiased(&s->p); }

int sampler_prefilter(const spark_sampler *s, float *inv_t, float *log_min_p)
{
    const spark_sampler_params *p = &s->p;
    if (p->temperature == 0 || !unbiased(p)) return 0;
    *inv_t = 1.0f / p->temperature; /* the very operations gather_candidates does */
    *log_min_p = p->min_p > 0 ? logf(p->min_p) : -INFINITY;
    return 1;
}

int32_t sampler_sample_candidates(spark_sampler *s, const float *x, const int32_t *ids, int32_t n, int complete,
                                  double total_all)
{
    for (int32_t i = 0; i < n; i++) s->cand[i] = (candidate){x[i], ids[i], 0.0};
    return finish(s, n, complete, total_all);
}

int32_t spark_sampler_sample(spark_sampler *s, const float *logits)
{
    const float *w = apply_bias_and_penalties(s, logits);
    if (s->p.temperature == 0) return greedy_pick(w, s->n_vocab);
    return finish(s, gather_candidates(s, w), 1, 0.0);
}

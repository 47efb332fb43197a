/*
 * hooks.c — steering, residual capture, FFN activation statistics and phase
 * timing (the seed runtime's instruments, SPEC §7).
 *
 * Steering is computed in double for the projections so that the modes are
 * exact to float32 rounding of the result; capture copies rows out; the
 * statistics read the activations without changing them.
 *
 * On a device backend (the GPU) the same arithmetic runs behind the
 * backend's instrument ops (backend.h): steering vectors are uploaded once,
 * captured rows are copied into a device staging buffer inside the chunk
 * and downloaded after it, FFN statistics accumulate on the device and come
 * back when read, and phase timing adds device timestamps.
 */
#include "engine/hooks.h"

#include "engine/session.h"

#include "base/error.h"
#include "base/mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double hooks_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- steering ------------------------------------------------------------- */

static spark_status hooks_usable(const spark_session *s)
{
    const backend_ops *o = s->be->ops;
    if (s->be->device_memory && !(o->upload && o->copy && o->steer && o->ffn_observe && o->stamp && o->device_times))
        return spark_fail(SPARK_ERR_UNSUPPORTED, "the %s backend does not support the instruments", o->name);
    return SPARK_OK;
}

static int on_device(const spark_session *s) { return s->be->device_memory; }

spark_status spark_session_add_steering(spark_session *s, int32_t layer, const float *direction,
                                        spark_steer_mode mode, float strength)
{
    const spark_model_config *c = &s->model->cfg;
    TRY(hooks_usable(s));
    if (layer < 0 || layer >= c->n_layer)
        return spark_fail(SPARK_ERR_ARG, "steering layer %d outside [0, %d)", layer, c->n_layer);
    if ((unsigned)mode >= SPARK_STEER_MODE_COUNT || !isfinite(strength) || !direction)
        return spark_fail(SPARK_ERR_ARG, "steering: bad mode %d or strength %g", (int)mode, strength);
    double norm = 0;
    for (int i = 0; i < c->n_embd; i++) norm += (double)direction[i] * direction[i];
    norm = sqrt(norm);
    if (!(norm > 0) || !isfinite(norm))
        return spark_fail(SPARK_ERR_ARG, "steering vector for layer %d has norm %g (must be finite and > 0)", layer,
                          norm);
    steer_entry *grown = realloc(s->hooks.steer, (size_t)(s->hooks.n_steer + 1) * sizeof *grown);
    if (!grown) return spark_fail(SPARK_ERR_NOMEM, "out of memory for a steering vector");
    s->hooks.steer = grown;
    steer_entry *e = &grown[s->hooks.n_steer];
    e->direction = malloc((size_t)c->n_embd * sizeof(float));
    e->unit = malloc((size_t)c->n_embd * sizeof(float));
    if (!e->direction || !e->unit) {
        free(e->direction);
        free(e->unit);
        return spark_fail(SPARK_ERR_NOMEM, "out of memory for a steering vector");
    }
    for (int i = 0; i < c->n_embd; i++) {
        e->direction[i] = direction[i];
        e->unit[i] = (float)(direction[i] / norm);
    }
    e->dev = NULL;
    if (on_device(s)) {
        if (s->be->ops->alloc(s->be, 2 * (size_t)c->n_embd * sizeof(float), &e->dev) != SPARK_OK) {
            free(e->direction);
            free(e->unit);
            return SPARK_ERR_NOMEM;
        }
        s->be->ops->upload(s->be, e->dev, e->direction, (size_t)c->n_embd);
        s->be->ops->upload(s->be, e->dev + c->n_embd, e->unit, (size_t)c->n_embd);
    }
    e->layer = layer;
    e->mode = mode;
    e->strength = strength;
    s->hooks.n_steer++;
    return SPARK_OK;
}

void spark_session_clear_steering(spark_session *s)
{
    for (int i = 0; i < s->hooks.n_steer; i++) {
        free(s->hooks.steer[i].direction);
        free(s->hooks.steer[i].unit);
        if (s->hooks.steer[i].dev) s->be->ops->release(s->be, s->hooks.steer[i].dev);
    }
    free(s->hooks.steer);
    s->hooks.steer = NULL;
    s->hooks.n_steer = 0;
}

static double dot(const float *a, const float *b, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (double)a[i] * b[i];
    return sum;
}

static void steer_row(const steer_entry *e, float *h, int n)
{
    const float *u = e->unit;
    double proj;
    switch (e->mode) {
    case SPARK_STEER_ADD:
        for (int i = 0; i < n; i++) h[i] += e->strength * e->direction[i];
        return;
    case SPARK_STEER_ABLATE:
        proj = dot(h, u, n);
        for (int i = 0; i < n; i++) h[i] = (float)(h[i] - e->strength * proj * u[i]);
        return;
    case SPARK_STEER_CLAMP:
        proj = dot(h, u, n);
        for (int i = 0; i < n; i++) h[i] = (float)(h[i] + (e->strength - proj) * u[i]);
        return;
    case SPARK_STEER_RENORM: {
        proj = dot(h, u, n);
        double before = sqrt(dot(h, h, n)), after = 0;
        for (int i = 0; i < n; i++) {
            double v = h[i] - proj * u[i];
            after += v * v;
        }
        after = sqrt(after);
        double scale = after > 0 ? before / after : 1.0;
        for (int i = 0; i < n; i++) h[i] = (float)((h[i] - proj * u[i]) * scale);
        return;
    }
    default:
        ASSERT(!"steer_row: unknown mode");
    }
}

/* ---- capture -------------------------------------------------------------- */

spark_status spark_session_capture_start(spark_session *s, int32_t first_layer, int32_t last_layer, int all_positions,
                                         int32_t position)
{
    const spark_model_config *c = &s->model->cfg;
    TRY(hooks_usable(s));
    if (first_layer < 0 || last_layer >= c->n_layer || first_layer > last_layer)
        return spark_fail(SPARK_ERR_ARG, "capture layers %d-%d outside [0, %d)", first_layer, last_layer, c->n_layer);
    capture_state *cap = &s->hooks.capture;
    cap->on = 1;
    cap->all_positions = all_positions;
    cap->first_layer = first_layer;
    cap->last_layer = last_layer;
    cap->position = position;
    cap->count = 0;
    return SPARK_OK;
}

void spark_session_capture_stop(spark_session *s) { s->hooks.capture.on = 0; }
int32_t spark_session_capture_count(const spark_session *s) { return s->hooks.capture.count; }
const float *spark_session_capture_data(const spark_session *s) { return s->hooks.capture.rows; }
const int32_t *spark_session_capture_positions(const spark_session *s) { return s->hooks.capture.positions; }

/* The slot of position p in the capture, appending a new one when needed. */
static float *capture_slot(spark_session *s, int64_t p)
{
    capture_state *cap = &s->hooks.capture;
    const spark_model_config *c = &s->model->cfg;
    int32_t layers = cap->last_layer - cap->first_layer + 1;
    /* positions arrive in increasing order: binary search the existing slots */
    int32_t lo = 0, hi = cap->count;
    while (lo < hi) {
        int32_t mid = (lo + hi) / 2;
        if (cap->positions[mid] < p) lo = mid + 1;
        else hi = mid;
    }
    if (lo < cap->count && cap->positions[lo] == p) return cap->rows + (size_t)lo * layers * c->n_embd;
    if (cap->count == cap->cap) {
        int32_t grow = cap->cap ? cap->cap * 2 : 16;
        float *rows = realloc(cap->rows, (size_t)grow * layers * c->n_embd * sizeof(float));
        if (!rows) return NULL;
        cap->rows = rows;
        int32_t *pos = realloc(cap->positions, (size_t)grow * sizeof(int32_t));
        if (!pos) return NULL;
        cap->positions = pos;
        cap->cap = grow;
    }
    cap->positions[cap->count] = (int32_t)p;
    return cap->rows + (size_t)cap->count++ * layers * c->n_embd;
}

static void capture_rows(spark_session *s, const float *x, int layer, int n, int64_t pos0)
{
    capture_state *cap = &s->hooks.capture;
    int32_t dim = s->model->cfg.n_embd;
    if (layer < cap->first_layer || layer > cap->last_layer) return;
    for (int t = 0; t < n; t++) {
        int64_t p = pos0 + t;
        if (!cap->all_positions && p != cap->position) continue;
        float *slot = capture_slot(s, p);
        if (!slot) return; /* out of memory: the capture stops growing */
        memcpy(slot + (size_t)(layer - cap->first_layer) * dim, x + (size_t)t * dim, (size_t)dim * sizeof(float));
    }
}

/* Device backends: steering through the backend's op, captured rows into
 * the stage (a copy of stage_rows rows per captured layer). */
static void after_layer_device(spark_session *s, float *x, int layer, int n)
{
    const backend_ops *o = s->be->ops;
    int dim = s->model->cfg.n_embd;
    for (int i = 0; i < s->hooks.n_steer; i++) {
        const steer_entry *e = &s->hooks.steer[i];
        if (e->layer == layer) o->steer(s->be, x, n, dim, (int)e->mode, e->strength, e->dev, e->dev + dim);
    }
    capture_state *cap = &s->hooks.capture;
    if (!cap->on || !cap->stage_rows || layer < cap->first_layer || layer > cap->last_layer) return;
    size_t rows = (size_t)cap->stage_rows * (size_t)dim;
    o->copy(s->be, cap->stage + (size_t)(layer - cap->first_layer) * rows, x + (size_t)cap->stage_t0 * dim, rows);
}

void hooks_before_chunk(spark_session *s, int n, int64_t pos0)
{
    capture_state *cap = &s->hooks.capture;
    cap->stage_rows = 0;
    if (!cap->on || !on_device(s)) return;
    if (cap->all_positions) {
        cap->stage_t0 = 0;
        cap->stage_rows = n;
    } else if (cap->position >= pos0 && cap->position < pos0 + n) {
        cap->stage_t0 = (int32_t)(cap->position - pos0);
        cap->stage_rows = 1;
    } else {
        return;
    }
    size_t need = (size_t)(cap->last_layer - cap->first_layer + 1) * (size_t)cap->stage_rows * s->model->cfg.n_embd;
    if (need > cap->stage_cap) {
        if (cap->stage) s->be->ops->release(s->be, cap->stage);
        cap->stage = NULL;
        cap->stage_cap = 0;
        if (s->be->ops->alloc(s->be, need * sizeof(float), &cap->stage) != SPARK_OK) {
            cap->stage_rows = 0; /* out of device memory: the capture stops growing */
            return;
        }
        cap->stage_cap = need;
    }
    if (need > cap->host_cap) {
        float *h = realloc(cap->host_stage, need * sizeof(float));
        if (!h) {
            cap->stage_rows = 0;
            return;
        }
        cap->host_stage = h;
        cap->host_cap = need;
    }
}

void hooks_after_chunk(spark_session *s, int64_t pos0)
{
    capture_state *cap = &s->hooks.capture;
    if (!cap->on || !on_device(s) || !cap->stage_rows) return;
    int32_t dim = s->model->cfg.n_embd, layers = cap->last_layer - cap->first_layer + 1;
    size_t rows = (size_t)cap->stage_rows * (size_t)dim;
    s->be->ops->download(s->be, cap->host_stage, cap->stage, (size_t)layers * rows);
    for (int32_t r = 0; r < cap->stage_rows; r++) {
        float *slot = capture_slot(s, pos0 + cap->stage_t0 + r);
        if (!slot) return;
        for (int32_t l = 0; l < layers; l++)
            memcpy(slot + (size_t)l * dim, cap->host_stage + (size_t)l * rows + (size_t)r * dim,
                   (size_t)dim * sizeof(float));
    }
    cap->stage_rows = 0;
}

void hooks_after_layer(spark_session *s, float *x, int layer, int n, int64_t pos0)
{
    int dim = s->model->cfg.n_embd;
    if (on_device(s)) {
        after_layer_device(s, x, layer, n);
        return;
    }
    for (int i = 0; i < s->hooks.n_steer; i++) {
        const steer_entry *e = &s->hooks.steer[i];
        if (e->layer != layer) continue;
        for (int t = 0; t < n; t++) steer_row(e, x + (size_t)t * dim, dim);
    }
    if (s->hooks.capture.on) capture_rows(s, x, layer, n, pos0);
}

/* ---- FFN statistics -------------------------------------------------------- */

static void ffn_release_device(backend *be, ffn_state *f)
{
    if (!f) return;
    void *bufs[] = {f->d_mass, f->d_overlap, f->d_hist, f->d_prev, f->d_scratch, f->d_has_prev};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) be->ops->release(be, (float *)bufs[i]);
    f->d_mass = f->d_overlap = NULL;
    f->d_hist = NULL;
    f->d_prev = f->d_scratch = NULL;
    f->d_has_prev = NULL;
}

static void ffn_free(ffn_state *f)
{
    if (!f) return;
    free(f->mass);
    free(f->histogram);
    free(f->overlap_sum);
    free(f->prev_top);
    free(f->cur_top);
    free(f->has_prev);
    free(f);
}

spark_status spark_session_ffn_stats_start(spark_session *s, int32_t top_k)
{
    const spark_model_config *c = &s->model->cfg;
    TRY(hooks_usable(s));
    if (top_k < 1 || top_k > c->n_ff)
        return spark_fail(SPARK_ERR_ARG, "FFN top-k %d outside [1, %d]", top_k, c->n_ff);
    spark_session_ffn_stats_stop(s);
    ffn_state *f = spark_calloc(1, sizeof *f, "FFN statistics");
    if (!f) return SPARK_ERR_NOMEM;
    f->mass = calloc((size_t)c->n_layer * c->n_ff, sizeof(double));
    f->histogram = calloc((size_t)c->n_layer * SPARK_FFN_BUCKETS, sizeof(uint64_t));
    f->overlap_sum = calloc((size_t)c->n_layer, sizeof(double));
    f->prev_top = calloc((size_t)c->n_layer * top_k, sizeof(int32_t));
    f->cur_top = calloc((size_t)top_k, sizeof(int32_t));
    f->has_prev = calloc((size_t)c->n_layer, 1);
    if (!f->mass || !f->histogram || !f->overlap_sum || !f->prev_top || !f->cur_top || !f->has_prev) {
        ffn_free(f);
        return spark_fail(SPARK_ERR_NOMEM, "out of memory for FFN statistics");
    }
    f->pub = (spark_ffn_stats){.n_layer = c->n_layer, .n_ff = c->n_ff, .top_k = top_k, .mass = f->mass,
                               .histogram = f->histogram, .overlap_sum = f->overlap_sum};
    if (on_device(s)) {
        size_t L = (size_t)c->n_layer, F = (size_t)c->n_ff;
        backend *be = s->be;
        spark_status st = be->ops->alloc(be, L * F * sizeof(double), (float **)&f->d_mass);
        if (st == SPARK_OK) st = be->ops->alloc(be, L * sizeof(double), (float **)&f->d_overlap);
        if (st == SPARK_OK) st = be->ops->alloc(be, L * SPARK_FFN_BUCKETS * sizeof(uint64_t), (float **)&f->d_hist);
        if (st == SPARK_OK) st = be->ops->alloc(be, L * F, (float **)&f->d_prev);
        if (st == SPARK_OK) st = be->ops->alloc(be, (size_t)s->n_batch * F, (float **)&f->d_scratch);
        if (st == SPARK_OK) st = be->ops->alloc(be, L * sizeof(int32_t), (float **)&f->d_has_prev);
        if (st != SPARK_OK) {
            ffn_release_device(be, f);
            ffn_free(f);
            return st;
        }
    }
    s->hooks.ffn = f;
    return SPARK_OK;
}

const spark_ffn_stats *spark_session_ffn_stats(const spark_session *s)
{
    ffn_state *f = s->hooks.ffn;
    if (!f) return NULL;
    if (f->dirty) { /* device accumulators: copy back (a session is used by one thread at a time) */
        const spark_model_config *c = &s->model->cfg;
        size_t L = (size_t)c->n_layer, F = (size_t)c->n_ff;
        backend *be = s->be;
        be->ops->download(be, (float *)f->mass, (const float *)f->d_mass, L * F * 2);
        be->ops->download(be, (float *)f->histogram, (const float *)f->d_hist, L * SPARK_FFN_BUCKETS * 2);
        be->ops->download(be, (float *)f->overlap_sum, (const float *)f->d_overlap, L * 2);
        f->dirty = 0;
    }
    return &f->pub;
}

void spark_session_ffn_stats_stop(spark_session *s)
{
    ffn_release_device(s->be, s->hooks.ffn);
    ffn_free(s->hooks.ffn);
    s->hooks.ffn = NULL;
}

static int bucket_of(float v)
{
    float a = fabsf(v);
    if (!(a > 0)) return 0;
    int e;
    frexpf(a, &e); /* a in [2^(e-1), 2^e) */
    int b = e - 1 - SPARK_FFN_BUCKET_MIN_EXP;
    return b < 0 ? 0 : b >= SPARK_FFN_BUCKETS ? SPARK_FFN_BUCKETS - 1 : b;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Indices of the k largest |act| (ties: lower index), sorted by index. */
static void top_neurons(const float *act, int n, int k, int32_t *out)
{
    int filled = 0;
    for (int i = 0; i < n; i++) { /* insertion into a small descending list */
        float a = fabsf(act[i]);
        if (filled == k && !(a > fabsf(act[out[k - 1]]))) continue;
        int j = filled < k ? filled++ : k - 1;
        while (j > 0 && a > fabsf(act[out[j - 1]])) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = i;
    }
    qsort(out, (size_t)k, sizeof *out, cmp_i32);
}

static int sorted_overlap(const int32_t *a, const int32_t *b, int k)
{
    int i = 0, j = 0, same = 0;
    while (i < k && j < k) {
        if (a[i] == b[j]) same++, i++, j++;
        else if (a[i] < b[j]) i++;
        else j++;
    }
    return same;
}

/* Device backends: the statistics on the device; the counts here. */
static void ffn_activation_device(spark_session *s, const float *act, int layer, int n)
{
    ffn_state *f = s->hooks.ffn;
    int n_ff = f->pub.n_ff, k = f->pub.top_k;
    ffn_observe_bufs b = {.mass = f->d_mass + (size_t)layer * n_ff,
                          .histogram = f->d_hist + (size_t)layer * SPARK_FFN_BUCKETS,
                          .overlap_sum = f->d_overlap + layer,
                          .prev_top = f->d_prev + (size_t)layer * n_ff,
                          .has_prev = f->d_has_prev + layer,
                          .scratch = f->d_scratch};
    s->be->ops->ffn_observe(s->be, act, n, n_ff, k, &b);
    if (layer == 0) {
        f->pub.n_pairs += f->has_prev[0] ? n : n - 1;
        f->pub.n_tokens += n;
    }
    f->has_prev[layer] = 1;
    f->dirty = 1;
}

void hooks_ffn_activation(spark_session *s, const float *act, int layer, int n)
{
    ffn_state *f = s->hooks.ffn;
    if (on_device(s)) {
        ffn_activation_device(s, act, layer, n);
        return;
    }
    int n_ff = f->pub.n_ff, k = f->pub.top_k;
    double *mass = f->mass + (size_t)layer * n_ff;
    uint64_t *hist = f->histogram + (size_t)layer * SPARK_FFN_BUCKETS;
    int32_t *prev = f->prev_top + (size_t)layer * k;
    for (int t = 0; t < n; t++) {
        const float *a = act + (size_t)t * n_ff;
        for (int i = 0; i < n_ff; i++) {
            mass[i] += fabsf(a[i]);
            hist[bucket_of(a[i])]++;
        }
        top_neurons(a, n_ff, k, f->cur_top);
        if (f->has_prev[layer]) {
            f->overlap_sum[layer] += (double)sorted_overlap(prev, f->cur_top, k) / k;
            if (layer == 0) f->pub.n_pairs++;
        }
        memcpy(prev, f->cur_top, (size_t)k * sizeof *prev);
        f->has_prev[layer] = 1;
        if (layer == 0) f->pub.n_tokens++;
    }
}

/* ---- timing ------------------------------------------------------------- */

static int device_timing(const spark_session *s)
{
    return s->be->device_memory && s->be->ops->stamp && s->be->ops->device_times;
}

void spark_session_timing(spark_session *s, int on)
{
    s->hooks.timing = on;
    memset(&s->hooks.times, 0, sizeof s->hooks.times);
    s->be->timing = on;
    s->be->device_wait = 0;
    if (device_timing(s)) {
        double sums[PHASE_COUNT];
        s->be->ops->device_times(s->be, sums, PHASE_COUNT); /* zeroes them */
        s->hooks.times.device = on;
    }
}

void hooks_stamp(spark_session *s, int phase)
{
    if (s->hooks.timing && device_timing(s)) s->be->ops->stamp(s->be, phase);
}

spark_phase_times spark_session_phase_times(const spark_session *s)
{
    if (s->hooks.timing && device_timing(s)) { /* collect the device's sums (synchronizes) */
        spark_session *w = (spark_session *)s; /* one thread at a time uses a session */
        double sums[PHASE_COUNT];
        w->be->ops->device_times(w->be, sums, PHASE_COUNT);
        spark_phase_times *t = &w->hooks.times;
        t->device_embed += sums[PHASE_EMBED];
        t->device_attention += sums[PHASE_ATTENTION];
        t->device_ffn += sums[PHASE_FFN];
        t->device_hooks += sums[PHASE_HOOKS];
        t->device_head += sums[PHASE_HEAD];
        t->device_wait = w->be->device_wait;
    }
    return s->hooks.times;
}

void hooks_release(spark_session *s)
{
    hooks *h = &s->hooks;
    for (int i = 0; i < h->n_steer; i++)
        if (h->steer[i].dev) s->be->ops->release(s->be, h->steer[i].dev), h->steer[i].dev = NULL;
    if (h->capture.stage) s->be->ops->release(s->be, h->capture.stage);
    h->capture.stage = NULL;
    h->capture.stage_cap = 0;
    ffn_release_device(s->be, h->ffn);
}

void hooks_free(hooks *h)
{
    for (int i = 0; i < h->n_steer; i++) {
        free(h->steer[i].direction);
        free(h->steer[i].unit);
    }
    free(h->steer);
    free(h->capture.rows);
    free(h->capture.positions);
    free(h->capture.host_stage);
    ffn_free(h->ffn);
    memset(h, 0, sizeof *h);
}

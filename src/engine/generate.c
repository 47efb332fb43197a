/*
 * generate.c — spark_generate(): prompt in, streamed text out.
 *
 * The loop: evaluate the prompt, then sample / check / evaluate one token at
 * a time. Text reaches the caller through two filters: the streaming
 * detokenizer (never half a UTF-8 character) and the stop-string holdback
 * (never text that might turn out to be the start of a stop string).
 */
#include "engine/session.h"

#include "base/error.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Text produced but not yet shown, because it may begin a stop string. */
typedef struct holdback {
    char *buf;
    size_t len, cap;
    const spark_generate_params *p;
} holdback;

static spark_status holdback_append(holdback *h, const char *text, size_t len)
{
    if (h->len + len + 1 > h->cap) {
        size_t cap = (h->len + len + 1) * 2;
        char *grown = realloc(h->buf, cap);
        if (!grown) return spark_fail(SPARK_ERR_NOMEM, "out of memory holding generated text");
        h->buf = grown;
        h->cap = cap;
    }
    memcpy(h->buf + h->len, text, len);
    h->len += len;
    h->buf[h->len] = '\0';
    return SPARK_OK;
}

/* Offset of the first complete stop string in the held text, or -1. */
static long find_stop(const holdback *h)
{
    long best = -1;
    for (int32_t i = 0; i < h->p->n_stop; i++) {
        const char *s = h->p->stop[i];
        if (!s || !*s) continue;
        const char *at = memmem(h->buf, h->len, s, strlen(s));
        if (at && (best < 0 || at - h->buf < best)) best = at - h->buf;
    }
    return best;
}

/* Bytes at the end of the held text that could start a stop string. */
static size_t possible_stop_prefix(const holdback *h)
{
    size_t keep = 0;
    for (int32_t i = 0; i < h->p->n_stop; i++) {
        const char *s = h->p->stop[i];
        size_t n = s ? strlen(s) : 0;
        for (size_t k = n > 0 ? n - 1 : 0; k > keep; k--)
            if (k <= h->len && !memcmp(h->buf + h->len - k, s, k)) {
                keep = k;
                break;
            }
    }
    return keep;
}

/* Hand the caller what is safe to show; returns non-zero when it asks to stop. */
static int holdback_release(holdback *h, int32_t id, size_t upto)
{
    const spark_generate_params *p = h->p;
    int stop = 0;
    if (p->on_token && (upto > 0 || id >= 0)) stop = p->on_token(p->user, id, h->buf, upto);
    memmove(h->buf, h->buf + upto, h->len - upto);
    h->len -= upto;
    if (h->buf) h->buf[h->len] = '\0';
    return stop;
}

static int is_stop_id(const spark_session *s, const spark_generate_params *p, int32_t id)
{
    if (!p->ignore_eos && id == s->model->cfg.eos_id) return 1;
    for (int32_t i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == id) return 1;
    return 0;
}

/* The most sampling candidates a backend hands over (backend.h's
 * candidates; SPARK_SAMPLE_CAP overrides, for tests): 16 KB back instead of
 * the logits, and top-p with the recommended 0.95 rarely needs more. */
enum { SAMPLE_CAP = 2048 };

typedef struct gen_state {
    spark_session *s;
    spark_detokenizer *dt;
    spark_sampler *sampler;
    const spark_generate_params *p;
    holdback hold;
    spark_generate_result *r;
    chunk_end end;         /* how each evaluated chunk ends: END_LOGITS, END_KEEP or END_PICK */
    float inv_t, log_min_p; /* END_KEEP: what the backend's candidates op needs */
    int32_t cap;
    float *cand_x;         /* END_KEEP: (cap) the candidates */
    int32_t *cand_id;
} gen_state;

/* Decode one generated id into the holdback; release what is safe.
 * Returns 1 when generation must end (stop string or callback). */
static int emit_token(gen_state *g, int32_t id, spark_status *st)
{
    const char *piece;
    size_t len;
    *st = SPARK_OK;
    if (!g->dt) { /* no tokenizer: ids only */
        const spark_generate_params *p = g->p;
        if (p->on_token && p->on_token(p->user, id, "", 0)) {
            g->r->finish = SPARK_FINISH_CANCELLED;
            return 1;
        }
        return 0;
    }
    *st = spark_detokenizer_push(g->dt, id, &piece, &len);
    if (*st == SPARK_OK) *st = holdback_append(&g->hold, piece, len);
    if (*st != SPARK_OK) return 1;
    long stop_at = find_stop(&g->hold);
    if (stop_at >= 0) {
        holdback_release(&g->hold, id, (size_t)stop_at);
        g->r->finish = SPARK_FINISH_STOP;
        return 1;
    }
    size_t safe = g->hold.len - possible_stop_prefix(&g->hold);
    if (holdback_release(&g->hold, id, safe)) {
        g->r->finish = SPARK_FINISH_CANCELLED;
        return 1;
    }
    return 0;
}

/* The next token from the last chunk's logits: from the backend's
 * candidates when they decide it (END_KEEP), else from the logits on the
 * host (copied there first with END_KEEP). */
static int32_t sample_next(gen_state *g)
{
    spark_session *s = g->s;
    const int32_t n_vocab = s->model->cfg.n_vocab;
    if (g->end == END_KEEP) {
        int complete;
        double total;
        int32_t n = s->be->ops->candidates(s->be, s->s.logits, n_vocab, g->inv_t, g->log_min_p, g->cap, g->cand_x,
                                           g->cand_id, &complete, &total);
        if (n > 0) {
            int32_t id = sampler_sample_candidates(g->sampler, g->cand_x, g->cand_id, n, complete, total);
            if (id != SAMPLER_MORE) return id;
        }
        s->be->ops->download(s->be, s->logits, s->s.logits, (size_t)n_vocab);
    }
    return spark_sampler_sample(g->sampler, s->logits);
}

/* One token through the model, ending as g->end says. */
static spark_status eval_one(gen_state *g, int32_t id)
{
    if (g->end == END_LOGITS) return spark_session_eval(g->s, &id, 1, g->s->logits, 0);
    return session_eval_end(g->s, &id, 1, g->end);
}

static spark_status generate_loop(gen_state *g)
{
    spark_session *s = g->s;
    const spark_generate_params *p = g->p;
    spark_status st = SPARK_OK;
    for (;;) {
        if (p->cancel && *p->cancel) {
            g->r->finish = SPARK_FINISH_CANCELLED;
            return SPARK_OK;
        }
        double t0 = s->hooks.timing ? hooks_now() : 0;
        int32_t id = sample_next(g);
        if (id < 0) return spark_fail(SPARK_ERR_ARG, "sampling: every token is banned by the logit bias");
        spark_sampler_accept(g->sampler, id);
        if (s->hooks.timing) s->hooks.times.sampling += hooks_now() - t0;
        g->r->n_generated++;
        if (is_stop_id(s, p, id)) {
            g->r->finish = SPARK_FINISH_EOS;
            return SPARK_OK;
        }
        if (emit_token(g, id, &st)) return st;
        if (p->max_tokens > 0 && g->r->n_generated >= p->max_tokens) {
            g->r->finish = SPARK_FINISH_LENGTH;
            return SPARK_OK;
        }
        if (s->pos + 1 > s->n_ctx) {
            g->r->finish = SPARK_FINISH_CONTEXT;
            return SPARK_OK;
        }
        TRY(eval_one(g, id));
    }
}

/* Greedy decoding where the backend picks (be->pick): the logits never leave
 * it, and on an asynchronous backend (pick_ahead) the step that consumes a
 * pick is issued before the host reads that pick, so the device runs the
 * next step while the host detokenizes, checks stops and records. A step
 * issued for a token that turns out to end generation is taken back
 * (pick_undo: the position steps back; the cache row it wrote is one a
 * later token overwrites, no further back than a rewind's slack allows).
 * On entry one pick is queued: the id of the token at s->pos, not yet
 * evaluated. `room`: another token may follow this one. *ahead: the step
 * consuming it was issued. */
static spark_status pick_next(spark_session *s, int room, int *ahead, int32_t *id)
{
    const backend_ops *be = s->be->ops;
    *ahead = be->pick_ahead && room;
    if (*ahead) TRY(session_step_picked(s, -1));
    *id = be->pick_read(s->be);
    if (*ahead) s->tokens[s->pos - 1] = *id;
    return SPARK_OK;
}

static void pick_undo(spark_session *s, int ahead)
{
    if (!ahead) return;
    s->be->ops->pick_drop(s->be);
    s->pos--;
}

static spark_status generate_picked(gen_state *g)
{
    spark_session *s = g->s;
    const spark_generate_params *p = g->p;
    spark_status st = SPARK_OK;
    for (;;) {
        int room = (p->max_tokens <= 0 || g->r->n_generated + 1 < p->max_tokens) && s->pos + 1 <= s->n_ctx &&
                   !(p->cancel && *p->cancel);
        int ahead;
        int32_t id;
        TRY(pick_next(s, room, &ahead, &id));
        int done = 1;
        if (p->cancel && *p->cancel) g->r->finish = SPARK_FINISH_CANCELLED;
        else if (id < 0) st = spark_fail(SPARK_ERR_ARG, "sampling: no token has a finite logit");
        else {
            spark_sampler_accept(g->sampler, id);
            g->r->n_generated++;
            if (is_stop_id(s, p, id)) g->r->finish = SPARK_FINISH_EOS;
            else if (emit_token(g, id, &st)) (void)0;
            else if (p->max_tokens > 0 && g->r->n_generated >= p->max_tokens) g->r->finish = SPARK_FINISH_LENGTH;
            else if (!ahead && s->pos + 1 > s->n_ctx) g->r->finish = SPARK_FINISH_CONTEXT;
            else done = 0;
        }
        if (done) {
            pick_undo(s, ahead);
            return st;
        }
        if (!ahead) TRY(session_step_picked(s, id));
    }
}

/* How this generation's chunks end: END_PICK (generate_picked) when the
 * sampler is plain greedy, the backend picks and no instrument watches the
 * steps (they would see a taken-back step); END_KEEP when the sampler takes
 * the backend's candidates; else END_LOGITS. SPARK_PICK=0: END_LOGITS
 * always (the host sampler on every logit, to compare). */
static chunk_end choose_end(gen_state *g)
{
    const spark_session *s = g->s;
    const backend_ops *be = s->be->ops;
    const char *env = getenv("SPARK_PICK");
    if (env && !strcmp(env, "0")) return END_LOGITS;
    const hooks *h = &s->hooks;
    if (be->pick && spark_sampler_plain_greedy(g->sampler) && !h->timing && !hooks_any_layer_hook(h) && !h->ffn)
        return END_PICK;
    if (be->candidates && sampler_prefilter(g->sampler, &g->inv_t, &g->log_min_p)) {
        const char *cap = getenv("SPARK_SAMPLE_CAP");
        g->cap = cap && atoi(cap) > 0 ? atoi(cap) : SAMPLE_CAP;
        g->cand_x = malloc((size_t)g->cap * sizeof(float));
        g->cand_id = malloc((size_t)g->cap * sizeof(int32_t));
        if (g->cand_x && g->cand_id) return END_KEEP;
    }
    return END_LOGITS;
}

/* What is still held at the end (a partial stop string that never
 * completed, or bytes of an unfinished character) is shown after all. */
static void flush_tail(gen_state *g)
{
    const char *piece;
    size_t len;
    if (!g->dt || g->r->finish == SPARK_FINISH_STOP || g->r->finish == SPARK_FINISH_CANCELLED) return;
    if (spark_detokenizer_flush(g->dt, &piece, &len) == SPARK_OK && len) holdback_append(&g->hold, piece, len);
    if (g->hold.len) holdback_release(&g->hold, -1, g->hold.len);
}

/* The prompt in n_batch pieces, so a cancel (a client gone, Ctrl-C) also
 * stops a long prefill; only the last piece computes logits. */
static spark_status eval_prompt(spark_session *s, const int32_t *prompt, int32_t n, chunk_end end,
                                volatile int *cancel, spark_generate_result *r)
{
    for (int32_t done = 0; done < n;) {
        if (cancel && *cancel) {
            r->finish = SPARK_FINISH_CANCELLED;
            return SPARK_OK;
        }
        int32_t piece = n - done < s->n_batch ? n - done : s->n_batch;
        int last = done + piece == n;
        if (last && end != END_LOGITS) TRY(session_eval_end(s, prompt + done, piece, end));
        else TRY(spark_session_eval(s, prompt + done, piece, last ? s->logits : NULL, 0));
        done += piece;
        if (s->progress && n > s->n_batch) s->progress(s->progress_user, done, n);
    }
    return SPARK_OK;
}

spark_status spark_generate(spark_session *s, const spark_tokenizer *tok, spark_sampler *sampler,
                            const int32_t *prompt, int32_t n_prompt, const spark_generate_params *params,
                            spark_generate_result *result)
{
    spark_generate_params none = {0};
    const spark_generate_params *p = params ? params : &none;
    spark_generate_result r = {.n_prompt = n_prompt};
    if (result) *result = r;
    if (!s || !sampler || !prompt || n_prompt < 1)
        return spark_fail(SPARK_ERR_ARG, "spark_generate: needs a session, sampler and >= 1 prompt token");
    if (!tok && p->n_stop > 0) return spark_fail(SPARK_ERR_ARG, "spark_generate: stop strings need a tokenizer");
    if (s->pos + n_prompt >= s->n_ctx)
        return spark_fail(SPARK_ERR_CONTEXT,
                          "the prompt (%d tokens, after %lld already in the session) leaves no room to generate in a "
                          "context of %d", n_prompt, (long long)s->pos, s->n_ctx);
    gen_state g = {.s = s, .sampler = sampler, .p = p, .hold = {.p = p}, .r = &r};
    if (tok) TRY(spark_detokenizer_create(tok, p->decode_flags, &g.dt));
    double t0 = now_seconds();
    g.end = choose_end(&g);
    int pick = g.end == END_PICK;
    if (pick) s->be->ops->pick_drop(s->be); /* nothing left queued by an earlier failure */
    spark_status st = eval_prompt(s, prompt, n_prompt, g.end, p->cancel, &r);
    for (int32_t i = 0; i < n_prompt; i++) spark_sampler_accept(sampler, prompt[i]);
    double t1 = now_seconds();
    if (st == SPARK_OK && r.finish != SPARK_FINISH_CANCELLED) st = pick ? generate_picked(&g) : generate_loop(&g);
    else if (pick) s->be->ops->pick_drop(s->be); /* cancelled in the prompt, or it failed */
    free(g.cand_x);
    free(g.cand_id);
    if (st == SPARK_OK) flush_tail(&g);
    r.prompt_seconds = t1 - t0;
    r.generate_seconds = now_seconds() - t1;
    spark_detokenizer_free(g.dt);
    free(g.hold.buf);
    if (result) *result = r;
    return st;
}

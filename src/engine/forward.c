/*
 * forward.c — the spark2_5 forward pass (SPEC §2), written once against the
 * backend interface. Read it next to the SPEC's pseudo-code:
 *
 *   h = embedding[token]
 *   for each layer: attention block (fused qkv, per-class rope, sliding or
 *                   full attention, sigmoid head gate BEFORE out_proj), add;
 *                   FFN block (gelu_erf(gate x) * up x, down), add
 *   logits = rmsnorm(h) @ embedding^T
 *
 * A call handles one chunk of n tokens; the residual stream stays fp32.
 */
#include "engine/session.h"

#include "base/error.h"
#include "engine/mutants.h"

const rope_class *rope_for_layer(const spark_session *s, int layer)
{
    /* full layers: partial rope at the long theta; sliding: whole head at 1e4 */
    return &s->rope[MUTANT_ROPE_CLASS(s->model->cfg.layer_kind[layer])];
}

static void attention_block(spark_session *s, const layer_weights *L, int layer, int n)
{
    const spark_model_config *c = &s->model->cfg;
    const backend_ops *be = s->be->ops;
    const scratch *a = &s->s;
    const attn_shape *sh = &s->shape;
    const rope_class *rc = rope_for_layer(s, layer);
    kv_layer *kv = &s->kv[layer];

    be->rmsnorm(s->be, a->xn, a->x, L->attn_norm, n, c->n_embd, c->rms_eps);
    be->matmul(s->be, a->qkv, a->xn, &L->qkv, n);  /* rows: q | k | v */
    be->matmul(s->be, a->gate, a->xn, &L->gate, n); /* from the SAME normed x */

    /* rope on q (n_head heads) and k (n_head_kv heads, right after q) */
    be->rope(s->be, a->qkv, n, sh->qkv_stride, c->n_head, c->head_dim, s->pos, rc);
    be->rope(s->be, a->qkv + config_q_dim(c), n, sh->qkv_stride, c->n_head_kv, c->head_dim, s->pos, rc);

    be->attention(s->be, a->attn, a->qkv, kv, s->pos, n, sh);
    be->kv_store(s->be, kv, a->qkv, s->pos, n, sh);

#if SPARK_MUTANT == 2
    be->matmul(s->be, a->proj, a->attn, &L->out, n);
    mutant_gate_after_out(a->proj, a->gate, n, c->n_head, c->n_embd);
#else
    be->gate_heads(s->be, a->attn, a->gate, n, c->n_head, c->head_dim); /* before out_proj */
    be->matmul(s->be, a->proj, a->attn, &L->out, n);
#endif
    be->add(s->be, a->x, a->proj, (int64_t)n * c->n_embd);
}

static void ffn_block(spark_session *s, const layer_weights *L, int layer, int n)
{
    const spark_model_config *c = &s->model->cfg;
    const backend_ops *be = s->be->ops;
    const scratch *a = &s->s;

    be->rmsnorm(s->be, a->xn, a->x, L->ffn_norm, n, c->n_embd, c->rms_eps);
    be->matmul(s->be, a->ff_a, a->xn, &L->ffn_gate, n);
    be->matmul(s->be, a->ff_b, a->xn, &L->ffn_up, n);
#if SPARK_MUTANT == 4
    mutant_tanh_gelu_mul(a->ff_a, a->ff_b, (int64_t)n * c->n_ff);
#else
    be->gelu_mul(s->be, a->ff_a, a->ff_b, (int64_t)n * c->n_ff);
#endif
    if (s->hooks.ffn) hooks_ffn_activation(s, a->ff_a, layer, n);
    be->matmul(s->be, a->proj, a->ff_a, &L->ffn_down, n);
    be->add(s->be, a->x, a->proj, (int64_t)n * c->n_embd);
}

/* Final norm and tied head, for the last row only or for every row, in
 * groups of HEAD_ROWS so the logits scratch stays small (131k floats a row).
 * logits == NULL: the last row's logits stay in the backend (s->s.logits),
 * with pick its greedy pick queued there too (be->pick). */
static void head(spark_session *s, int n, float *logits, int all_positions, int pick)
{
    const spark_model *m = s->model;
    const spark_model_config *c = &m->cfg;
    const backend_ops *be = s->be->ops;
    const scratch *a = &s->s;
    for (int first = all_positions ? 0 : n - 1; first < n; first += HEAD_ROWS) {
        int rows = n - first < HEAD_ROWS ? n - first : HEAD_ROWS;
        be->rmsnorm(s->be, a->xn, a->x + (int64_t)first * c->n_embd, m->final_norm, rows, c->n_embd, c->rms_eps);
        be->matmul(s->be, a->logits, a->xn, &m->head, rows);
        if (s->hooks.timing) hooks_stamp(s, PHASE_HEAD); /* device timing: before the copy waits */
        if (!logits) {
            if (pick) be->pick(s->be, a->logits, c->n_vocab);
            return;
        }
        be->download(s->be, logits, a->logits, (size_t)rows * (size_t)c->n_vocab);
        logits += (size_t)rows * (size_t)c->n_vocab;
    }
}

/* Phase timing: adds the time since *mark to *sum and restarts the mark. */
static void lap(spark_session *s, double *sum, double *mark)
{
    if (!s->hooks.timing) return;
    double now = hooks_now();
    *sum += now - *mark;
    *mark = now;
}

/* The chunk through every layer, then what `end` asks of the head. */
static spark_status forward(spark_session *s, const int32_t *ids, int n, chunk_end end, float *logits,
                            int all_positions)
{
    const spark_model *m = s->model;
    spark_phase_times *t = &s->hooks.times;
    double mark = s->hooks.timing ? hooks_now() : 0;
    ASSERT(n > 0 && n <= s->n_batch && s->pos + n <= s->n_ctx && (ids || n == 1));
    int layer_hooks = hooks_any_layer_hook(&s->hooks);
    if (s->hooks.capture.on) hooks_before_chunk(s, n, s->pos); /* device backends: staging */

    s->be->ops->embed(s->be, s->s.x, &m->embedding, ids, n); /* no scale, no norm */
    if (s->hooks.timing) hooks_stamp(s, -1); /* device timing starts after the gather */
    lap(s, &t->embed, &mark);
    for (int i = 0; i < m->cfg.n_layer; i++) {
        attention_block(s, &m->layers[i], i, n);
        if (s->hooks.timing) hooks_stamp(s, PHASE_ATTENTION);
        lap(s, &t->attention, &mark);
        ffn_block(s, &m->layers[i], i, n);
        if (s->hooks.timing) hooks_stamp(s, PHASE_FFN);
        lap(s, &t->ffn, &mark);
        /* the layer's whole contribution is in: steering first, then capture */
        if (layer_hooks) {
            hooks_after_layer(s, s->s.x, i, n, s->pos);
            if (s->hooks.timing) hooks_stamp(s, PHASE_HOOKS);
        }
        lap(s, &t->hooks, &mark);
    }
    if (end != END_NONE) head(s, n, end == END_LOGITS ? logits : NULL, all_positions, end == END_PICK);
    if (s->hooks.capture.on) hooks_after_chunk(s, s->pos); /* device backends: captured rows back */
    lap(s, &t->head, &mark);
    t->tokens += n;
    t->calls++;
    s->pos += n;
    return SPARK_OK;
}

spark_status forward_chunk(spark_session *s, const int32_t *ids, int n, float *logits, int all_positions)
{
    return forward(s, ids, n, logits ? END_LOGITS : END_NONE, logits, all_positions);
}

spark_status forward_chunk_end(spark_session *s, const int32_t *ids, int n, chunk_end end)
{
    ASSERT(end != END_PICK || s->be->ops->pick);
    return forward(s, ids, n, end, NULL, 0);
}

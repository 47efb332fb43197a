/*
 * cuda_graph.cu — decode steps of the CUDA backend as CUDA graphs: a
 * single-token step's commands are recorded instead of launched, rewritten
 * into fused launches (fuse), captured once as a graph of programmatic
 * dependent launches and replayed for every later token with the same
 * commands (the position and the token id live in device memory), or handed
 * to the persistent step kernel (cuda_step.cu) when SPARK_CUDA_MEGA=1.
 */
#include "backend/cuda/cuda_state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace spark_cuda {

/* ---- decode steps as CUDA graphs ---------------------------------------------- */
/*
 * A single-token step (embed with n == 1 up to the next synchronizing call)
 * is recorded instead of launched: ~14 kernels a layer cost more to launch
 * one by one than the GPU needs to run them. At the step's end the recorded
 * commands are compared with the ones the current graph was captured from;
 * equal (the usual case: same buffers, same shapes, only the position and
 * the token differ, and those live in device memory) -> one graph launch;
 * different -> capture a new graph. SPARK_CUDA_GRAPH=0 turns this off.
 */

/* Append c to a growable command array (*q, *n of *cap). */
void push_cmd(cmd **q, size_t *n, size_t *cap, const cmd *c, const char *what)
{
    if (*n == *cap) {
        size_t ncap = *cap ? 2 * *cap : 1024;
        cmd *nq = (cmd *)realloc(*q, ncap * sizeof *nq);
        if (!nq) cuda_fatal("realloc", what, __FILE__, __LINE__);
        *q = nq;
        *cap = ncap;
    }
    memcpy(&(*q)[(*n)++], c, sizeof *c);
}

void record(cuda_backend *cb, const cmd *c)
{
    push_cmd(&cb->q, &cb->nq, &cb->qcap, c, "out of host memory for the command queue");
}


/* ---- fusion of a recorded decode step --------------------------------------- */
/*
 * The forward pass issues a layer as ~16 small ops; a recorded single-token
 * step is rewritten here into fewer launches, by patterns that check every
 * buffer they rely on (anything that does not match runs as recorded):
 *
 *   rmsnorm(xn <- x); matmul(a <- xn); [matmul(b <- xn); [gelu_mul(a, b)]]
 *       -> one fgemv: the norm in its x load, block 0 still writing xn;
 *          two matmuls as two row segments of one launch (qkv + gate), or
 *          as a gate/up pair with the GELU-mul in the epilogue (ffn);
 *   matmul(p <- a); add(x += p)      -> one fgemv writing p and x += p;
 *   rope(q); rope(k); attention; kv_store
 *       -> rope_kv (rope both, store k/v), then attention: the store moves
 *          before the attention, safe because the slot of the current
 *          position is never one the attention reads (rings hold >= window
 *          slots, full layers >= n_ctx); while the context is short
 *          (step_ok) all of it is one launch, cu_attn_step; over an f16 /
 *          bf16 cache (coded attention + coded store) only that launch
 *          replaces them, else they run as recorded;
 *   attention; gate_heads(attn, g) -> attention with the gate in its output.
 *
 * Every buffer ends the step as the unfused ops leave it (xn, the matmul
 * outputs, the gated attention, the cache), so nothing downstream can tell.
 */

bool fg_matmul_ok(const cmd *m)
{
    return m->op == OP_MATMUL && m->n == 1 && cu_fgemv_ok(m->dtype, m->cols, m->row_bytes, m->w, m->rows);
}

bool al16(const void *p) { return ((uintptr_t)p % 16) == 0; }

void fq_push(cuda_backend *cb, const cmd *c)
{
    push_cmd(&cb->fq, &cb->nfq, &cb->fqcap, c, "out of host memory for the fused command queue");
}

/* Instruments that cost a launch each are folded into the fused GEMV next
 * to them, where the GEMV does their work exactly: a phase timestamp just
 * before a GEMV becomes that GEMV's first act (after its dependency wait,
 * the moment the stamp kernel would have run), and a steering `add` right
 * after a GEMV's residual add joins its epilogue (same float operations as
 * steer_kernel). Every other instrument keeps its own kernel. */
void fold_hooks(cuda_backend *cb)
{
    size_t w = 0;
    for (size_t i = 0; i < cb->nfq; i++) {
        cmd *c = &cb->fq[i];
        cmd *next = i + 1 < cb->nfq ? &cb->fq[i + 1] : NULL;
        if (c->op == OP_HOOK && c->hk.kind == CU_HOOK_STAMP && next && next->op == OP_FGEMV && !next->fg.stamps) {
            next->fg.stamps = c->hk.stamps;
            next->fg.stamp_phase = c->hk.phase;
            continue;
        }
        if (c->op == OP_HOOK && c->hk.kind == CU_HOOK_STEER && c->hk.mode == SPARK_STEER_ADD && c->hk.n == 1 && w > 0) {
            cmd *prev = &cb->fq[w - 1];
            if (prev->op == OP_FGEMV && !prev->fg.pair && prev->fg.resid == c->hk.x && !prev->fg.steer_dir &&
                prev->fg.rows1 == 0 && prev->fg.rows0 == c->hk.dim) {
                prev->fg.steer_dir = c->hk.dir;
                prev->fg.steer_alpha = c->hk.strength;
                continue;
            }
        }
        if (w != i) cb->fq[w] = *c;
        w++;
    }
    cb->nfq = w;
}

/* The rope angles of a step depend on the position and the layer's class
 * only, so each class's cos / sin (double, as the kernels computed them)
 * come from one kernel at the step's start; the rope_kv commands read them.
 * Classes past ROPE_TABLES keep computing their own. */
void rope_tables(cuda_backend *cb)
{
    if (!cb->ropetab) return;
    double theta[ROPE_TABLES];
    int rot[ROPE_TABLES], nt = 0;
    for (size_t i = 0; i < cb->nfq; i++) {
        cmd *c = &cb->fq[i];
        const bool step = c->op == OP_ATTN && c->attn.step;
        const int rd = step ? c->attn.rot_dims : c->rot_dims;
        const double th = step ? c->attn.theta : c->theta;
        if ((c->op != OP_ROPEKV && !step) || rd < 2) continue;
        int k = 0;
        while (k < nt && !(theta[k] == th && rot[k] == rd)) k++;
        if (k == nt) {
            if (nt == ROPE_TABLES) continue;
            theta[nt] = th;
            rot[nt++] = rd;
        }
        const float *tab = cb->ropetab + (size_t)k * CUDA_MAX_HEAD_DIM;
        if (step) c->attn.rope_tab = tab;
        else c->y = tab;
    }
    if (!nt) return;
    cmd t = new_cmd(OP_ROPETAB, 1);
    for (int k = 0; k < nt; k++) fq_push(cb, &t); /* room for nt more; then they go to the front */
    memmove(cb->fq + nt, cb->fq, (cb->nfq - nt) * sizeof *cb->fq);
    for (int k = 0; k < nt; k++) {
        t.out = cb->ropetab + (size_t)k * CUDA_MAX_HEAD_DIM;
        t.rot_dims = rot[k];
        t.theta = theta[k];
        cb->fq[k] = t;
    }
}

/* The attention of one token as cu_attn_args: an f32 cache's OP_ATTN as
 * recorded, a coded cache's OP_KVATTN (cuda_kv.cu) in the fields the
 * one-launch step reads (kv_fmt naming its rows; cu_attn_step_ok decides
 * whether that kernel takes the format). */
static bool attn_of(const cmd *at, cmd *out)
{
    if (at->op == OP_ATTN) {
        *out = *at;
        return at->attn.n == 1;
    }
    const cu_kv_attn_args *k = &at->kva;
    if (at->op != OP_KVATTN || k->n != 1 || k->gate) return false;
    *out = new_cmd(OP_ATTN, 1);
    cu_attn_args *a = &out->attn;
    a->out = k->out;
    a->qkv = k->qkv;
    a->kc = (const float *)k->kc;
    a->vc = (const float *)k->vc;
    a->pos = k->pos;
    a->slots = k->slots;
    a->qkv_stride = k->qkv_stride;
    a->n = 1;
    a->n_head = k->n_head;
    a->n_head_kv = k->n_head_kv;
    a->head_dim = k->head_dim;
    a->window = k->window;
    a->splits = 1;
    a->scale = k->scale;
    a->step_ok = k->step_ok;
    a->pdl_early = k->pdl_early;
    a->kv_fmt = k->fmt;
    return true;
}

/* Whether kv stores the token's k / v rows of qkv into the cache aa reads. */
static bool store_matches(const cmd *kv, const cu_attn_args *aa)
{
    if (kv->op == OP_KV)
        return aa->kv_fmt == CU_KV_F32 && kv->n == 1 && kv->x == aa->qkv && kv->k == aa->kc && kv->v == aa->vc &&
               kv->slots == aa->slots && kv->heads == aa->n_head && kv->rows == aa->n_head_kv &&
               kv->head_dim == aa->head_dim && kv->stride == aa->qkv_stride;
    const cu_kv_attn_args *k = &kv->kva;
    return kv->op == OP_KVSTORE && k->fmt == aa->kv_fmt && k->n == 1 && k->qkv == aa->qkv &&
           (const void *)k->kc == (const void *)aa->kc && (const void *)k->vc == (const void *)aa->vc &&
           k->slots == aa->slots && k->n_head == aa->n_head && k->n_head_kv == aa->n_head_kv &&
           k->head_dim == aa->head_dim && k->qkv_stride == aa->qkv_stride;
}

/* rope q (r1), rope k (r2), the attention (at) and the kv store (kv) of one
 * token, in the order the forward records them: whether they fuse, and the
 * attention with the rope's class in *out. */
static bool rope_attn_store(const cmd *r1, const cmd *r2, const cmd *at, const cmd *kv, cmd *out)
{
    if (!attn_of(at, out)) return false;
    cu_attn_args *aa = &out->attn;
    const int64_t q_dim = (int64_t)aa->n_head * aa->head_dim;
    const bool ok = r2->n == 1 && r1->out == aa->qkv && r1->heads == aa->n_head && r1->head_dim == aa->head_dim &&
                    r1->stride == aa->qkv_stride && r2->out == aa->qkv + q_dim && r2->heads == aa->n_head_kv &&
                    r2->head_dim == aa->head_dim && r2->rot_dims == r1->rot_dims && r2->theta == r1->theta &&
                    r2->stride == aa->qkv_stride && store_matches(kv, aa) &&
                    (aa->window == 0 || aa->slots >= aa->window) && r1->rot_dims <= aa->head_dim &&
                    aa->head_dim <= 1024;
    aa->rot_dims = r1->rot_dims;
    aa->theta = r1->theta;
    return ok;
}

void fuse(cuda_backend *cb)
{
    const cmd *q = cb->q;
    const size_t n = cb->nq;
    cb->nfq = 0;
    size_t i = 0;
    while (i < n) {
        const cmd *c = &q[i];
        /* rmsnorm + matmul(s) [+ gelu_mul] */
        if (c->op == OP_RMSNORM && c->n == 1 && i + 1 < n && fg_matmul_ok(&q[i + 1]) && q[i + 1].x == c->out &&
            q[i + 1].cols == c->cols && al16(c->x) && al16(c->y) && al16(c->out) && c->cols % 4 == 0 &&
            c->out != c->x && q[i + 1].out != c->x) {
            /* (no output may be the input x: blocks load x at different times) */
            const cmd *m1 = &q[i + 1];
            cmd f = new_cmd(OP_FGEMV, 1);
            f.fg = fgemv_of_matmul(m1);
            cu_fgemv_args *a = &f.fg;
            a->x = c->x; /* the norm's input, normalised by the kernel into xn */
            a->nw = c->y;
            a->eps = c->eps;
            a->xn = c->out;
            size_t used = 2;
            const cmd *m2 = i + 2 < n ? &q[i + 2] : NULL;
            if (m2 && fg_matmul_ok(m2) && m2->dtype == m1->dtype && m2->x == c->out && m2->cols == m1->cols &&
                m2->row_bytes == m1->row_bytes &&
                m2->out != m1->out && m2->out != c->x) {
                const cmd *g = i + 3 < n ? &q[i + 3] : NULL;
                if (g && g->op == OP_GELU && g->out == m1->out && g->x == m2->out && g->count == m1->rows &&
                    m2->rows == m1->rows) {
                    a->pair = 1;
                    a->w1 = m2->w;
                    a->out1 = m2->out;
                    a->rows1 = m2->rows;
                    used = 4;
                } else if (m1->rows + m2->rows < ((int64_t)1 << 31)) {
                    a->w1 = m2->w;
                    a->out1 = m2->out;
                    a->rows1 = m2->rows;
                    used = 3;
                }
            }
            fq_push(cb, &f);
            i += used;
            continue;
        }
        /* matmul + residual add */
        if (fg_matmul_ok(c) && al16(c->x) && i + 1 < n && q[i + 1].op == OP_ADD && q[i + 1].x == c->out &&
            q[i + 1].count == c->rows && q[i + 1].out != c->x && q[i + 1].out != c->out && c->out != c->x) {
            cmd f = new_cmd(OP_FGEMV, 1);
            f.fg = fgemv_of_matmul(c);
            f.fg.resid = q[i + 1].out;
            fq_push(cb, &f);
            i += 2;
            continue;
        }
        /* rope q + rope k + attention + kv store [+ gate] */
        cmd a2;
        if (c->op == OP_ROPE && c->n == 1 && i + 3 < n && q[i + 1].op == OP_ROPE &&
            rope_attn_store(c, &q[i + 1], &q[i + 2], &q[i + 3], &a2)) {
            if (a2.attn.step_ok && cu_attn_step_ok(&a2.attn)) {
                a2.attn.step = 1; /* rope, store and attention in one launch (cuda_attn_step.cu) */
            } else if (a2.attn.kv_fmt != CU_KV_F32) {
                fq_push(cb, c); /* a coded cache's commands stay as they are */
                i++;
                continue;
            } else {
                const cu_attn_args *aa = &a2.attn;
                cmd f = new_cmd(OP_ROPEKV, 1);
                f.out = c->out;
                f.heads = aa->n_head;
                f.rows = aa->n_head_kv;
                f.head_dim = aa->head_dim;
                f.rot_dims = c->rot_dims;
                f.theta = c->theta;
                f.k = (float *)aa->kc;
                f.v = (float *)aa->vc;
                f.slots = aa->slots;
                fq_push(cb, &f);
            }
            size_t used = 4;
            const cmd *g = i + 4 < n ? &q[i + 4] : NULL;
            if (g && g->op == OP_GATE && g->n == 1 && g->out == a2.attn.out && g->heads == a2.attn.n_head &&
                g->head_dim == a2.attn.head_dim) {
                a2.attn.gate = g->x;
                used = 5;
            }
            fq_push(cb, &a2);
            i += used;
            continue;
        }
        /* attention + gate */
        if (c->op == OP_ATTN && c->attn.n == 1 && i + 1 < n && q[i + 1].op == OP_GATE && q[i + 1].n == 1 &&
            q[i + 1].out == c->attn.out && q[i + 1].heads == c->attn.n_head && q[i + 1].head_dim == c->attn.head_dim) {
            cmd a2 = *c;
            a2.attn.gate = q[i + 1].x;
            fq_push(cb, &a2);
            i += 2;
            continue;
        }
        fq_push(cb, c);
        i++;
    }
    fold_hooks(cb);
    rope_tables(cb);
    cb->fused = (long)n - (long)cb->nfq;
}

/* ---- SPARK_CUDA_TIMELINE=FILE: when every block of a step ran -------------- */
/*
 * A diagnostic for the decode step's kernel boundaries (bench/cuda_timeline.py
 * reads the file): each fused GEMV and one-launch attention of a captured
 * step is given a record (tl_mark in the kernels: every block's entry, end of
 * its dependency wait and exit, in %globaltimer ns). The graph's replays
 * overwrite the records, so at the backend's end they hold the last step's;
 * timeline_dump writes one JSON line per launch. Off (no record) by default.
 */
enum { TL_LAUNCHES = 512 };
static const size_t TL_PER = (size_t)CU_TL_MAX_BLOCKS * CU_TL_MARKS;

void timeline_init(cuda_backend *cb)
{
    const char *p = getenv("SPARK_CUDA_TIMELINE");
    if (!p || !*p || !cb->fuse_on) return;
    cb->tl_path = strdup(p);
    cb->tl_cmd = (cmd *)calloc(TL_LAUNCHES, sizeof *cb->tl_cmd);
    if (!cb->tl_path || !cb->tl_cmd) cuda_fatal("calloc", "out of host memory for SPARK_CUDA_TIMELINE", __FILE__, __LINE__);
    CK(cudaMalloc((void **)&cb->tl_dev, TL_LAUNCHES * TL_PER * sizeof *cb->tl_dev));
    CK(cudaMemset(cb->tl_dev, 0, TL_LAUNCHES * TL_PER * sizeof *cb->tl_dev));
}

static void timeline_assign(cuda_backend *cb, cmd *list, size_t count)
{
    if (!cb->tl_dev) return;
    cb->tl_n = 0;
    for (size_t i = 0; i < count && cb->tl_n < TL_LAUNCHES; i++) {
        cmd *c = &list[i];
        unsigned long long *rec = cb->tl_dev + (size_t)cb->tl_n * TL_PER;
        if (c->op == OP_FGEMV) c->fg.tl = rec;
        else if (c->op == OP_ATTN && c->attn.step) c->attn.tl = rec;
        else continue;
        cb->tl_cmd[cb->tl_n++] = *c;
    }
}

void timeline_dump(cuda_backend *cb)
{
    if (!cb->tl_dev || !cb->tl_n || !cb->replays) return;
    unsigned long long *h = (unsigned long long *)malloc((size_t)cb->tl_n * TL_PER * sizeof *h);
    FILE *f = fopen(cb->tl_path, "w");
    if (!h || !f || cudaMemcpy(h, cb->tl_dev, (size_t)cb->tl_n * TL_PER * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "spark: SPARK_CUDA_TIMELINE: %s not written (%s)\n", cb->tl_path,
                !f ? strerror(errno) : "no memory or no copy");
        if (f) fclose(f);
        free(h);
        return;
    }
    for (int k = 0; k < cb->tl_n; k++) {
        const cmd *c = &cb->tl_cmd[k];
        if (c->op == OP_FGEMV)
            fprintf(f, "{\"launch\":%d,\"op\":\"fgemv\",\"dtype\":%d,\"rows0\":%lld,\"rows1\":%lld,\"cols\":%d,"
                       "\"row_bytes\":%lld,\"pair\":%d,\"norm\":%d,\"resid\":%d,\"blocks\":[",
                    k, c->fg.dtype, (long long)c->fg.rows0, (long long)c->fg.rows1, c->fg.cols,
                    (long long)c->fg.row_bytes, c->fg.pair, c->fg.nw != NULL, c->fg.resid != NULL);
        else
            fprintf(f, "{\"launch\":%d,\"op\":\"attn\",\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,\"window\":%d,"
                       "\"blocks\":[", k, c->attn.n_head, c->attn.n_head_kv, c->attn.head_dim, c->attn.window);
        const unsigned long long *r = h + (size_t)k * TL_PER;
        for (int b = 0; b < CU_TL_MAX_BLOCKS && r[b * CU_TL_MARKS]; b++)
            for (int m = 0; m < CU_TL_MARKS; m++)
                fprintf(f, "%s%llu%s", m ? "," : b ? ",[" : "[", r[b * CU_TL_MARKS + m], m == CU_TL_MARKS - 1 ? "]" : "");
        fprintf(f, "]}\n");
    }
    fclose(f);
    free(h);
}

/* Capture the recorded step (fused when the fast path is on) as a graph. */
bool capture(cuda_backend *cb)
{
    cudaGraph_t g = NULL;
    if (cb->tl_dev) /* (outside the capture: a memset node would stand between programmatic launches) */
        CK(cudaMemsetAsync(cb->tl_dev, 0, TL_LAUNCHES * TL_PER * sizeof *cb->tl_dev, cb->st));
    if (cudaStreamBeginCapture(cb->st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    const cmd *list = cb->q;
    size_t count = cb->nq;
    if (cb->fast && cb->fuse_on) {
        fuse(cb);
        timeline_assign(cb, cb->fq, cb->nfq);
        list = cb->fq;
        count = cb->nfq;
    }
    cb->pdl_now = cb->pdl_on;
    cb->graph_att_steps = 0;
    for (size_t i = 0; i < count; i++) {
        run_cmd(cb, &list[i]);
        cb->graph_att_steps += list[i].op == OP_ATTN && list[i].attn.step;
    }
    cb->pdl_now = 0;
    cudaError_t e = cudaStreamEndCapture(cb->st, &g);
    if (e == cudaSuccess && g) e = cudaGraphInstantiate(&cb->exec, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess || !cb->exec) {
        cudaGetLastError();
        cb->exec = NULL;
        return false;
    }
    cmd *copy = (cmd *)realloc(cb->gq, cb->nq * sizeof *copy);
    if (!copy) cuda_fatal("realloc", "out of host memory for the graph's commands", __FILE__, __LINE__);
    memcpy(copy, cb->q, cb->nq * sizeof *copy);
    cb->gq = copy;
    cb->ngq = cb->nq;
    return true;
}

/* The fused step as the persistent kernel's phases: embed, then per layer
 * GEMV (norm + qkv + gate), ATTN (rope_kv + attention), GEMV (out + add),
 * GEMV (norm + gate/up pair), GEMV (down + add), then the head's GEMV.
 * NULL when any command is of another kind. */
cu_mega *mega_build(cuda_backend *cb)
{
    fuse(cb);
    cu_mk_phase *ph = (cu_mk_phase *)calloc(cb->nfq ? cb->nfq : 1, sizeof *ph);
    if (!ph) return NULL;
    int np = 0;
    bool ok = true;
    for (size_t i = 0; i < cb->nfq && ok; i++) {
        const cmd *c = &cb->fq[i];
        if (c->op == OP_ROPETAB) continue; /* the persistent kernel computes its angles itself */
        cu_mk_phase *p = &ph[np++];
        if (c->op == OP_EMBED && c->n == 1) {
            p->kind = CU_MK_EMBED;
            p->dtype = c->dtype;
            p->table = c->w;
            p->cols = c->cols;
            p->row_bytes = c->row_bytes;
            p->out = c->out;
        } else if (c->op == OP_FGEMV) {
            p->kind = CU_MK_GEMV;
            p->dtype = c->fg.dtype; /* the persistent kernel takes bf16 only */
            p->fg = c->fg;
        } else if (c->op == OP_ATTN && c->attn.step && c->attn.kv_fmt == CU_KV_F32) { /* rope, store, attention */
            p->kind = CU_MK_ATTN;
            p->at = c->attn;
            p->at.step = 0;
            p->at.rope_tab = NULL;
            p->rot_dims = c->attn.rot_dims;
            p->theta = c->attn.theta;
        } else if (c->op == OP_ROPEKV && i + 1 < cb->nfq && cb->fq[i + 1].op == OP_ATTN &&
                   cb->fq[i + 1].attn.qkv == c->out && cb->fq[i + 1].attn.kc == c->k &&
                   cb->fq[i + 1].attn.vc == c->v && cb->fq[i + 1].attn.slots == c->slots && !cb->fq[i + 1].attn.flash) {
            p->kind = CU_MK_ATTN;
            p->at = cb->fq[i + 1].attn;
            p->rot_dims = c->rot_dims;
            p->theta = c->theta;
            i++;
        } else {
            ok = false;
        }
    }
    cu_mega *mk = ok ? cu_mega_create(ph, np, cb->sms, cb->d_pos, cb->ids) : NULL;
    free(ph);
    return mk;
}

/* The recorded step as one persistent-kernel launch, if it takes it. */
bool mega_run(cuda_backend *cb)
{
    bool same = cb->mq_valid && cb->nmq == cb->nq && !memcmp(cb->mq, cb->q, cb->nq * sizeof *cb->q);
    if (!same) {
        cu_mega_destroy(cb->mk);
        cb->mk = mega_build(cb);
        cmd *copy = (cmd *)realloc(cb->mq, cb->nq * sizeof *copy);
        if (!copy) cuda_fatal("realloc", "out of host memory for the step's commands", __FILE__, __LINE__);
        memcpy(copy, cb->q, cb->nq * sizeof *copy);
        cb->mq = copy;
        cb->nmq = cb->nq;
        cb->mq_valid = 1;
    }
    if (!cb->mk) return false;
    CK(cu_mega_launch(cb->mk, cb->st));
    cb->mega_runs++;
    return true;
}

/* The recorded step: as the persistent kernel, a replay of the current
 * graph, or a new capture. */
void launch_step(cuda_backend *cb)
{
    CK(cu_set_step(cb->st, cb->d_pos, cb->step_pos, cb->ids, cb->step_id, cb->pick_keys));
    pair_forget(cb); /* the step writes activations behind run_cmd's back */
    cb->pos_set = 1;
    cb->pos_host = cb->step_pos;
    if (cb->mega_on && mega_run(cb)) return;
    bool same = cb->exec && cb->ngq == cb->nq && !memcmp(cb->gq, cb->q, cb->nq * sizeof *cb->q);
    if (!same) {
        if (cb->exec) cudaGraphExecDestroy(cb->exec);
        cb->exec = NULL;
        cb->captures++;
        bool ok = capture(cb);
        if (!ok && cb->pdl_on) { /* programmatic launches not capturable here: without them */
            cb->pdl_on = 0;
            ok = capture(cb);
        }
        if (!ok) { /* not capturable here: run it as it is, and stop trying */
            cb->graphs = 0;
            for (size_t i = 0; i < cb->nq; i++) run_cmd(cb, &cb->q[i]);
            return;
        }
    }
    CK(cudaGraphLaunch(cb->exec, cb->st));
    cb->replays++;
    cb->att_step_runs += cb->graph_att_steps;
}

/* Run the recorded step, if any. */
void flush(cuda_backend *cb)
{
    if (!cb->recording) return;
    cb->recording = 0;
    const double t0 = cb->verbose ? host_now() : 0;
    if (cb->verbose) {
        cb->host_record += t0 - cb->host_t0;
        cb->host_steps++;
    }
    launch_step(cb);
    if (cb->pick_pending) {
        cb->pick_pending = 0;
        pick_copy(cb);
    }
    if (cb->verbose) cb->host_flush += host_now() - t0;
}

/* A command from an op: recorded inside a single-token step, else launched. */
void submit(cuda_backend *cb, const cmd *c)
{
    if (cb->recording && c->n == 1) {
        record(cb, c);
        return;
    }
    flush(cb);
    run_cmd(cb, c);
}

/* The position kernels read from cb->d_pos: the step's, or set now. */
void set_pos(cuda_backend *cb, int64_t pos0)
{
    if (cb->recording) {
        cb->step_pos = pos0;
        return;
    }
    if (cb->pos_set && cb->pos_host == pos0) return;
    CK(cu_set_i64(cb->st, cb->d_pos, pos0));
    cb->pos_set = 1;
    cb->pos_host = pos0;
}

} // namespace spark_cuda

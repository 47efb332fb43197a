/*
 * quantize_file.c — `spark quantize`: a checkpoint (HF directory or GGUF)
 * to a GGUF v3 file with its matrices in another format.
 *
 * The model is loaded as for inference (so its config and tensor names are
 * validated), the output tensor list is built from the bound weights in
 * SPEC §4 order, and each matrix is streamed: chunks of rows are decoded
 * with weight_row_to_f32, quantized in parallel, and written, so memory
 * stays at one chunk. A matrix already in the target format is copied
 * byte for byte. Norm vectors are written as F32 (what llama.cpp does).
 *
 * Recipe Q4_K_M (llama.cpp's mix, as the published Spark-X2.5 Q4_K_M file
 * has it: Q4_K and Q6_K blocks only):
 *   token_embd (= the tied output) and an untied output       Q6_K
 *   attn_qkv and ffn_down in the "more bits" layers: the first
 *     and last eighth of the stack and every third in between  Q6_K
 *     (attn_qkv holds v, which llama.cpp's recipe favours)
 *   every other matrix, attn_gate included                     Q4_K
 * A matrix whose rows are not a whole number of 256-value blocks (only in
 * small test models) falls back to Q8_0 (rows of 32k) or F16.
 */
#include "model/hf_meta.h"
#include "model/quantize.h"

#include "base/error.h"
#include "base/mem.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CHUNK_BYTES = 64 << 20, MAX_OUT = 16 };

typedef enum tensor_role { ROLE_EMBED, ROLE_OUTPUT, ROLE_QKV, ROLE_GATE, ROLE_OUT, ROLE_FFN_GATE, ROLE_FFN_UP,
                           ROLE_FFN_DOWN, ROLE_NORM, ROLE_COUNT } tensor_role;

typedef struct out_tensor {
    char name[64];
    tensor_role role;
    int layer;
    const weight_ref *src; /* a matrix, or NULL for a norm */
    const float *vec;      /* a norm vector (f32, n_embd values) */
    spark_dtype dtype;     /* as written */
    int64_t rows, cols;
} out_tensor;

typedef struct plan {
    out_tensor *t;
    int n, cap;
} plan;

/* ---- choosing the output type --------------------------------------------------------- */

/* llama.cpp's "use more bits" layers: first and last eighth, every third between. */
static int more_bits_layer(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static spark_dtype recipe_type(const quantize_options *o, tensor_role role, int layer, int n_layer)
{
    if (o->recipe != QUANT_RECIPE_Q4_K_M) return o->type;
    if (role == ROLE_EMBED || role == ROLE_OUTPUT) return SPARK_DTYPE_Q6_K;
    if ((role == ROLE_QKV || role == ROLE_FFN_DOWN) && more_bits_layer(layer, n_layer)) return SPARK_DTYPE_Q6_K;
    return SPARK_DTYPE_Q4_K;
}

/* The requested type, or a fallback whose blocks fit the rows. */
static spark_dtype fitting_type(spark_dtype want, int64_t cols, quantize_report *rep)
{
    if (cols % dtype_block_elems(want) == 0) return want;
    rep->n_fallback++;
    return cols % 32 == 0 ? SPARK_DTYPE_Q8_0 : SPARK_DTYPE_F16;
}

/* ---- the tensor list ---------------------------------------------------------------- */

static spark_status plan_add(plan *p, const char *name, tensor_role role, int layer, const weight_ref *src,
                             const float *vec, int64_t n_vec)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        out_tensor *t = realloc(p->t, (size_t)cap * sizeof *t);
        if (!t) return spark_fail(SPARK_ERR_NOMEM, "out of memory planning the output tensors");
        p->t = t;
        p->cap = cap;
    }
    out_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->role = role;
    t->layer = layer;
    t->src = src;
    t->vec = vec;
    t->rows = src ? src->rows : 1;
    t->cols = src ? src->cols : n_vec;
    return SPARK_OK;
}

static spark_status build_plan(const spark_model *m, const quantize_options *o, plan *p, quantize_report *rep)
{
    const spark_model_config *c = &m->cfg;
    char name[64];
    TRY(plan_add(p, "token_embd.weight", ROLE_EMBED, 0, &m->embedding, NULL, 0));
    for (int i = 0; i < c->n_layer; i++) {
        const layer_weights *L = &m->layers[i];
        static const char *const names[] = {"attn_qkv", "attn_gate", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
        const weight_ref *mats[] = {&L->qkv, &L->gate, &L->out, &L->ffn_gate, &L->ffn_up, &L->ffn_down};
        const tensor_role roles[] = {ROLE_QKV, ROLE_GATE, ROLE_OUT, ROLE_FFN_GATE, ROLE_FFN_UP, ROLE_FFN_DOWN};
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", i);
        TRY(plan_add(p, name, ROLE_NORM, i, NULL, L->attn_norm, c->n_embd));
        for (int k = 0; k < 6; k++) {
            if (k == 3) {
                snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", i);
                TRY(plan_add(p, name, ROLE_NORM, i, NULL, L->ffn_norm, c->n_embd));
            }
            snprintf(name, sizeof name, "blk.%d.%s.weight", i, names[k]);
            TRY(plan_add(p, name, roles[k], i, mats[k], NULL, 0));
        }
    }
    TRY(plan_add(p, "output_norm.weight", ROLE_NORM, 0, NULL, m->final_norm, c->n_embd));
    if (!m->tied_head) TRY(plan_add(p, "output.weight", ROLE_OUTPUT, 0, &m->head, NULL, 0));
    for (int i = 0; i < p->n; i++) {
        out_tensor *t = &p->t[i];
        t->dtype = t->role == ROLE_NORM ? SPARK_DTYPE_F32
                                        : fitting_type(recipe_type(o, t->role, t->layer, c->n_layer), t->cols, rep);
    }
    return SPARK_OK;
}

/* ---- metadata ------------------------------------------------------------------------- */

static uint32_t file_type_of(const quantize_options *o)
{
    if (o->recipe == QUANT_RECIPE_Q4_K_M) return 15; /* llama_ftype MOSTLY_Q4_K_M */
    switch (o->type) {
    case SPARK_DTYPE_F32: return 0;
    case SPARK_DTYPE_F16: return 1;
    case SPARK_DTYPE_Q4_0: return 2;
    case SPARK_DTYPE_Q8_0: return 7;
    case SPARK_DTYPE_Q4_K: return 14; /* MOSTLY_Q4_K_S: every matrix Q4_K */
    case SPARK_DTYPE_Q6_K: return 18;
    case SPARK_DTYPE_BF16: return 32;
    default: return 0;
    }
}

/* GGUF input: every key but the ones that describe the old file's encoding. */
static spark_status copy_gguf_meta(gguf_writer *w, const gguf_file *g, uint32_t file_type)
{
    for (int64_t i = 0; i < g->n_kvs; i++) {
        const char *k = g->kvs[i].key;
        if (!strcmp(k, "general.file_type") || !strcmp(k, "general.alignment") ||
            !strcmp(k, "general.quantization_version"))
            continue;
        TRY(gguf_writer_copy_kv(w, &g->kvs[i]));
    }
    TRY(gguf_writer_set_u32(w, "general.file_type", file_type));
    return gguf_writer_set_u32(w, "general.quantization_version", 2);
}

/* ---- tensor data ------------------------------------------------------------------------ */

typedef struct chunk_job {
    const out_tensor *t;
    int64_t r0, nr;
    size_t out_row;
    uint8_t *out;
    float *scratch; /* per thread: cols floats */
    spark_status status;
} chunk_job;

/* Rows [r0, r0 + nr) of t into out (decode, check finite, quantize). */
static void quantize_chunk(chunk_job *j, int n_threads)
{
    const out_tensor *t = j->t;
    int bad = 0;
    int64_t bad_row = -1;
#pragma omp parallel num_threads(n_threads)
    {
        float *row = j->scratch + (size_t)omp_get_thread_num() * (size_t)t->cols;
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < j->nr; r++) {
            weight_row_to_f32(t->src, j->r0 + r, row);
            int finite = 1;
            for (int64_t c = 0; c < t->cols; c++) finite &= isfinite(row[c]) != 0;
            if (!finite) {
#pragma omp critical
                {
                    bad = 1;
                    bad_row = j->r0 + r;
                }
                continue;
            }
            quantize_row(t->dtype, row, t->cols, j->out + (size_t)r * j->out_row);
        }
    }
    j->status = bad ? spark_fail(SPARK_ERR_FORMAT, "tensor '%s' row %lld holds a NaN or infinity", t->src->name,
                                 (long long)bad_row)
                    : SPARK_OK;
}

static spark_status write_matrix(gguf_writer *w, const out_tensor *t, int n_threads, uint8_t *buf, float *scratch)
{
    size_t in_row = (size_t)dtype_row_bytes(t->src->dtype, (uint64_t)t->cols);
    size_t out_row = (size_t)dtype_row_bytes(t->dtype, (uint64_t)t->cols);
    if (t->src->dtype == t->dtype) /* same format: the bytes as stored */
        return gguf_writer_write(w, t->src->data, in_row * (size_t)t->rows);
    int64_t chunk_rows = (int64_t)(CHUNK_BYTES / out_row);
    if (chunk_rows < 1) chunk_rows = 1;
    for (int64_t r0 = 0; r0 < t->rows; r0 += chunk_rows) {
        chunk_job j = {.t = t, .r0 = r0, .nr = t->rows - r0 < chunk_rows ? t->rows - r0 : chunk_rows,
                       .out_row = out_row, .out = buf, .scratch = scratch};
        quantize_chunk(&j, n_threads);
        TRY(j.status);
        TRY(gguf_writer_write(w, buf, out_row * (size_t)j.nr));
    }
    return SPARK_OK;
}

static spark_status write_tensors(gguf_writer *w, const plan *p, int n_threads, int verbose, quantize_report *rep)
{
    int64_t max_cols = 1;
    for (int i = 0; i < p->n; i++) max_cols = p->t[i].cols > max_cols ? p->t[i].cols : max_cols;
    uint8_t *buf = malloc(CHUNK_BYTES + (size_t)max_cols * sizeof(float));
    float *scratch = malloc((size_t)n_threads * (size_t)max_cols * sizeof(float));
    spark_status st = buf && scratch ? SPARK_OK : spark_fail(SPARK_ERR_NOMEM, "out of memory for quantization buffers");
    for (int i = 0; i < p->n && st == SPARK_OK; i++) {
        const out_tensor *t = &p->t[i];
        if (t->src) st = write_matrix(w, t, n_threads, buf, scratch);
        else st = gguf_writer_write(w, t->vec, (size_t)t->cols * sizeof(float));
        if (st != SPARK_OK) break;
        uint64_t in = t->src ? dtype_row_bytes(t->src->dtype, (uint64_t)t->cols) * (uint64_t)t->rows : 0;
        uint64_t out = dtype_row_bytes(t->dtype, (uint64_t)t->cols) * (uint64_t)t->rows;
        rep->bytes_in += in;
        rep->bytes_out += out;
        rep->count[t->dtype]++;
        rep->n_tensors++;
        if (verbose)
            fprintf(stderr, "[%3d/%3d] %-28s %-5s -> %-5s [%lld, %lld] %8.2f MiB\n", i + 1, p->n, t->name,
                    t->src ? dtype_name(t->src->dtype) : "f32", dtype_name(t->dtype), (long long)t->rows,
                    (long long)t->cols, (double)out / (1 << 20));
    }
    free(buf);
    free(scratch);
    return st;
}

static spark_status convert(const spark_model *m, const char *in, const char *out, const quantize_options *o,
                            quantize_report *rep)
{
    plan p = {0};
    gguf_writer *w = NULL;
    int n_threads = o->n_threads > 0 ? o->n_threads : omp_get_num_procs();
    spark_status st = build_plan(m, o, &p, rep);
    if (st == SPARK_OK) st = gguf_writer_create(out, 0, &w);
    if (st == SPARK_OK)
        st = m->format == MODEL_FORMAT_GGUF ? copy_gguf_meta(w, &m->gguf, file_type_of(o))
                                            : hf_meta_write(w, m, in, file_type_of(o));
    for (int i = 0; i < p.n && st == SPARK_OK; i++) {
        int64_t shape[2] = {p.t[i].rows, p.t[i].cols};
        st = p.t[i].src ? gguf_writer_add_tensor(w, p.t[i].name, p.t[i].dtype, 2, shape)
                        : gguf_writer_add_tensor(w, p.t[i].name, p.t[i].dtype, 1, shape + 1);
    }
    if (st == SPARK_OK) st = gguf_writer_begin_data(w);
    if (st == SPARK_OK) st = write_tensors(w, &p, n_threads, o->verbose, rep);
    if (st == SPARK_OK) st = gguf_writer_finish(w);
    gguf_writer_free(w);
    free(p.t);
    return st;
}

spark_status quantize_model_file(const char *in, const char *out, const quantize_options *o, quantize_report *rep)
{
    memset(rep, 0, sizeof *rep);
    spark_dtype t = o->type;
    if ((unsigned)t >= SPARK_DTYPE_COUNT) return spark_fail(SPARK_ERR_ARG, "quantize: invalid output type %d", (int)t);
    spark_model *m = NULL;
    spark_model_load_options lo = spark_model_default_load_options();
    lo.mode = SPARK_LOAD_MMAP; /* each tensor is read once: a copy would only cost time and RAM */
    TRY(spark_model_load_ex(in, &lo, &m));
    spark_status st = convert(m, in, out, o, rep);
    spark_model_free(m);
    return st;
}

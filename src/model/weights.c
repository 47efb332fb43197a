/*
 * weights.c — find each tensor the forward pass needs, check its dtype and
 * shape, and bind it into the model's layer structs.
 *
 * Two naming schemes are accepted: Hugging Face (SPEC §3, with the aliases
 * other converters write) and GGUF (SPEC §4). Matrices are referenced in
 * place; norm vectors are converted to float32 because the forward pass
 * reads them once per token in every format.
 */
#include "model/model.h"

#include "base/error.h"
#include "base/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tensor_names {
    const char *embedding[3];
    const char *head[2];
    const char *final_norm[2];
    /* per layer, printf patterns with one %d; [1] is an alias or NULL */
    const char *attn_norm[2], *qkv[2], *gate[2], *out[3], *ffn_norm[2], *ffn_gate[2], *ffn_up[2], *ffn_down[2];
} tensor_names;

static const tensor_names hf_names = {
    .embedding = {"model.embedding.weight", "model.embed_tokens.weight", NULL},
    .head = {"lm_head.weight", NULL},
    .final_norm = {"model.norm.weight", NULL},
    .attn_norm = {"model.layers.%d.input_layernorm.weight", NULL},
    .qkv = {"model.layers.%d.self_attn.q_k_v_proj.weight", NULL},
    .gate = {"model.layers.%d.self_attn.g_proj.weight", NULL},
    .out = {"model.layers.%d.self_attn.out_proj.weight", "model.layers.%d.self_attn.o_proj.weight", NULL},
    .ffn_norm = {"model.layers.%d.post_attention_layernorm.weight", NULL},
    .ffn_gate = {"model.layers.%d.mlp.gate_proj.weight", NULL},
    .ffn_up = {"model.layers.%d.mlp.up_proj.weight", NULL},
    .ffn_down = {"model.layers.%d.mlp.down_proj.weight", NULL},
};

static const tensor_names gguf_names = {
    .embedding = {"token_embd.weight", NULL},
    .head = {"output.weight", NULL},
    .final_norm = {"output_norm.weight", NULL},
    .attn_norm = {"blk.%d.attn_norm.weight", NULL},
    .qkv = {"blk.%d.attn_qkv.weight", NULL},
    .gate = {"blk.%d.attn_gate.weight", NULL},
    .out = {"blk.%d.attn_output.weight", NULL},
    .ffn_norm = {"blk.%d.ffn_norm.weight", NULL},
    .ffn_gate = {"blk.%d.ffn_gate.weight", NULL},
    .ffn_up = {"blk.%d.ffn_up.weight", NULL},
    .ffn_down = {"blk.%d.ffn_down.weight", NULL},
};

/* The formats the CPU matrix product reads today. */
static int dtype_supported(spark_dtype dt)
{
    return dt == SPARK_DTYPE_F32 || dt == SPARK_DTYPE_F16 || dt == SPARK_DTYPE_BF16 || dt == SPARK_DTYPE_Q8_0 ||
           dt == SPARK_DTYPE_Q4_0 || dt == SPARK_DTYPE_Q4_K || dt == SPARK_DTYPE_Q6_K;
}

typedef struct binder {
    spark_model *model;
    const char *file; /* for messages */
    const char *names_tried[3];
} binder;

/* Find the first present name among `patterns` (formatted with `layer`). */
static const tensor_info *find_tensor(binder *b, const char *const *patterns, int layer, char *name_out, size_t cap)
{
    for (int i = 0; patterns[i]; i++) {
        snprintf(name_out, cap, patterns[i], layer);
        const tensor_info *t = tensor_dir_find(b->model->tensors, name_out);
        if (t) return t;
    }
    snprintf(name_out, cap, patterns[0], layer);
    return NULL;
}

static const char *tensor_file(const spark_model *m, const tensor_info *t)
{
    return t && t->file ? t->file : m->path;
}

/* A GGUF tensor of a GGML type we cannot read is listed with a meaningless
 * dtype; catch it here by name. */
static spark_status check_readable_type(const spark_model *m, const tensor_info *t)
{
    if (m->format != MODEL_FORMAT_GGUF) return SPARK_OK;
    int64_t idx = t - m->gguf.tensors.tensors;
    uint32_t ggml = m->gguf.ggml_types[idx];
    if (dtype_from_ggml(ggml) < 0) {
        const char *name = ggml_type_name(ggml);
        return spark_fail(SPARK_ERR_UNSUPPORTED,
                          "%s: tensor '%s' has type %s (%u); this runtime reads F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K",
                          tensor_file(m, t), t->name, name ? name : "unknown", ggml);
    }
    return SPARK_OK;
}

static spark_status bind_matrix(binder *b, const char *const *patterns, int layer, int64_t rows, int64_t cols,
                                weight_ref *out)
{
    char name[256];
    spark_model *m = b->model;
    const tensor_info *t = find_tensor(b, patterns, layer, name, sizeof name);
    if (!t) return spark_fail(SPARK_ERR_MISSING, "%s: missing tensor '%s'", m->path, name);
    TRY(check_readable_type(m, t));
    if (!dtype_supported(t->dtype))
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which the matrix product cannot read",
                          tensor_file(m, t), t->name, dtype_name(t->dtype));
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return spark_fail(SPARK_ERR_SHAPE, "%s: tensor '%s' has shape [%lld%s%lld%s], expected [%lld, %lld]",
                          tensor_file(m, t), t->name, (long long)t->shape[0], t->n_dims > 1 ? ", " : "",
                          t->n_dims > 1 ? (long long)t->shape[1] : 0LL, t->n_dims > 2 ? ", ..." : "",
                          (long long)rows, (long long)cols);
    if (cols % dtype_block_elems(t->dtype) != 0)
        return spark_fail(SPARK_ERR_SHAPE, "%s: tensor '%s': %lld columns are not a multiple of the %s block (%d)",
                          tensor_file(m, t), t->name, (long long)cols, dtype_name(t->dtype),
                          dtype_block_elems(t->dtype));
    *out = (weight_ref){.name = t->name, .dtype = t->dtype, .rows = rows, .cols = cols, .data = t->data};
    m->weight_bytes += t->nbytes;
    return SPARK_OK;
}

/* Norm vectors: any float dtype, 1-D of length n, converted to float32. */
static spark_status bind_vector(binder *b, const char *const *patterns, int layer, int64_t n, float **out)
{
    char name[256];
    spark_model *m = b->model;
    const tensor_info *t = find_tensor(b, patterns, layer, name, sizeof name);
    if (!t) return spark_fail(SPARK_ERR_MISSING, "%s: missing tensor '%s'", m->path, name);
    TRY(check_readable_type(m, t));
    if (t->dtype != SPARK_DTYPE_F32 && t->dtype != SPARK_DTYPE_F16 && t->dtype != SPARK_DTYPE_BF16)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: norm tensor '%s' has dtype %s (expected F32, F16 or BF16)",
                          tensor_file(m, t), t->name, dtype_name(t->dtype));
    if (t->n_dims != 1 || t->shape[0] != n)
        return spark_fail(SPARK_ERR_SHAPE, "%s: tensor '%s' has %d dims (first %lld), expected shape [%lld]",
                          tensor_file(m, t), t->name, t->n_dims, (long long)t->shape[0], (long long)n);
    float *v = spark_calloc((size_t)n, sizeof(float), t->name);
    if (!v) return SPARK_ERR_NOMEM;
    weight_ref as_row = {.name = t->name, .dtype = t->dtype, .rows = 1, .cols = n, .data = t->data};
    weight_row_to_f32(&as_row, 0, v);
    *out = v;
    m->weight_bytes += t->nbytes;
    return SPARK_OK;
}

static spark_status bind_layer(binder *b, const tensor_names *nm, int i)
{
    const spark_model_config *c = &b->model->cfg;
    layer_weights *L = &b->model->layers[i];
    int64_t e = c->n_embd;
    TRY(bind_vector(b, nm->attn_norm, i, e, &L->attn_norm));
    TRY(bind_matrix(b, nm->qkv, i, config_qkv_dim(c), e, &L->qkv));
    TRY(bind_matrix(b, nm->gate, i, c->n_head, e, &L->gate));
    TRY(bind_matrix(b, nm->out, i, e, config_q_dim(c), &L->out));
    TRY(bind_vector(b, nm->ffn_norm, i, e, &L->ffn_norm));
    TRY(bind_matrix(b, nm->ffn_gate, i, c->n_ff, e, &L->ffn_gate));
    TRY(bind_matrix(b, nm->ffn_up, i, c->n_ff, e, &L->ffn_up));
    TRY(bind_matrix(b, nm->ffn_down, i, e, c->n_ff, &L->ffn_down));
    return SPARK_OK;
}

/* Tied unless a separate head is stored that is not a copy of the embedding. */
static spark_status bind_head(binder *b, const tensor_names *nm, int config_says_tied)
{
    spark_model *m = b->model;
    const spark_model_config *c = &m->cfg;
    char name[256];
    const tensor_info *t = find_tensor(b, nm->head, 0, name, sizeof name);
    int same_as_embedding = t && t->dtype == m->embedding.dtype && t->n_dims == 2 && t->shape[0] == c->n_vocab &&
                            t->shape[1] == c->n_embd && !memcmp(t->data, m->embedding.data, t->nbytes);
    if (!t || same_as_embedding) {
        if (!config_says_tied)
            return spark_fail(SPARK_ERR_MISSING, "%s: tie_word_embeddings is false but there is no '%s' tensor",
                              m->path, name);
        m->head = m->embedding;
        m->tied_head = 1;
        return SPARK_OK;
    }
    m->tied_head = 0;
    return bind_matrix(b, nm->head, 0, c->n_vocab, c->n_embd, &m->head);
}

spark_status weights_bind(spark_model *m)
{
    const tensor_names *nm = m->format == MODEL_FORMAT_GGUF ? &gguf_names : &hf_names;
    const spark_model_config *c = &m->cfg;
    binder b = {.model = m, .file = m->path};
    m->weight_bytes = 0;
    m->layers = spark_calloc((size_t)c->n_layer, sizeof *m->layers, "layer table");
    if (!m->layers) return SPARK_ERR_NOMEM;
    TRY(bind_matrix(&b, nm->embedding, 0, c->n_vocab, c->n_embd, &m->embedding));
    TRY(bind_vector(&b, nm->final_norm, 0, c->n_embd, &m->final_norm));
    for (int i = 0; i < c->n_layer; i++) TRY(bind_layer(&b, nm, i));
    return bind_head(&b, nm, m->tied_head);
}

void weights_release(spark_model *m)
{
    if (m->layers) {
        for (int i = 0; i < m->cfg.n_layer; i++) {
            free(m->layers[i].attn_norm);
            free(m->layers[i].ffn_norm);
        }
    }
    free(m->layers);
    free(m->final_norm);
    m->layers = NULL;
    m->final_norm = NULL;
}

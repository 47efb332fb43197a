/*
 * model.h — a loaded spark2_5 checkpoint: its config and its weights bound
 * to per-layer structs, the way the forward pass reads them.
 *
 * Matrices stay where the loader mapped them (no copies); only the small
 * norm vectors are converted to float32 at load. Every field carries its
 * shape in a trailing comment, PyTorch order (out, in).
 */
#ifndef SPARK_MODEL_MODEL_H
#define SPARK_MODEL_MODEL_H

#include "spark.h"
#include "io/gguf.h"
#include "io/tensor_dir.h"

#include <stdint.h>

/* A matrix [rows, cols] in its stored format; row r starts at
 * data + r * dtype_row_bytes(dtype, cols). */
typedef struct weight_ref {
    const char *name; /* the checkpoint's tensor name (owned by the model) */
    spark_dtype dtype;
    int64_t rows, cols;
    const void *data;
} weight_ref;

typedef struct layer_weights {
    float *attn_norm;      /* (n_embd) */
    weight_ref qkv;        /* (n_head*D + 2*n_head_kv*D, n_embd): rows q, then k, then v */
    weight_ref gate;       /* (n_head, n_embd): one sigmoid gate per query head */
    weight_ref out;        /* (n_embd, n_head*D) */
    float *ffn_norm;       /* (n_embd) */
    weight_ref ffn_gate;   /* (n_ff, n_embd) */
    weight_ref ffn_up;     /* (n_ff, n_embd) */
    weight_ref ffn_down;   /* (n_embd, n_ff) */
} layer_weights;

typedef enum model_format { MODEL_FORMAT_HF = 0, MODEL_FORMAT_GGUF, MODEL_FORMAT_COUNT } model_format;

struct spark_model {
    char *path;
    model_format format;
    spark_model_config cfg;
    uint8_t *layer_kind;     /* (n_layer) spark_layer_kind; cfg.layer_kind points here */
    tensor_dir hf_tensors;   /* MODEL_FORMAT_HF: the safetensors mappings */
    gguf_file gguf;          /* MODEL_FORMAT_GGUF: the file and its tensors */
    const tensor_dir *tensors; /* whichever of the two holds the tensors */
    weight_ref embedding;    /* (n_vocab, n_embd) */
    weight_ref head;         /* (n_vocab, n_embd): the embedding itself when tied */
    int tied_head;
    float *final_norm;       /* (n_embd) */
    layer_weights *layers;   /* (n_layer) */
    uint64_t weight_bytes;   /* bytes the forward pass reads per token */
    spark_model_load_info load; /* how the files are held (load.c) */
};

/* ---- load.c ---- */

/* SPARK_LOAD_AUTO's choice for weight files of `file_bytes` when `avail`
 * bytes of memory are available (0 = unknown) and the system's THP setting
 * is `thp`: SPARK_LOAD_COPY or SPARK_LOAD_MMAP, with the reason in why[n]. */
spark_load_mode model_choose_load(uint64_t file_bytes, uint64_t avail, thp_setting thp, char *why, size_t n);

/* Memory this process may still use: MemAvailable, capped by a cgroup v2
 * limit; 0 when unknown. */
uint64_t model_memory_available(void);

/* ---- config.c ---- */

/* Fill cfg (and a malloc'd layer_kind array) from an HF config.json. */
spark_status config_from_hf(const char *config_path, spark_model_config *cfg, uint8_t **layer_kind,
                            int *tied_head);

/* Fill cfg from a GGUF file's `spark2_5.*` metadata. */
spark_status config_from_gguf(const gguf_file *g, spark_model_config *cfg, uint8_t **layer_kind);

/* Reject configs the forward pass cannot honour (naming the field). */
spark_status config_validate(const spark_model_config *cfg, const char *source);

/* Query width per token: rows of q in the fused projection. */
static inline int64_t config_q_dim(const spark_model_config *c) { return (int64_t)c->n_head * c->head_dim; }
static inline int64_t config_kv_dim(const spark_model_config *c) { return (int64_t)c->n_head_kv * c->head_dim; }
static inline int64_t config_qkv_dim(const spark_model_config *c)
{
    return config_q_dim(c) + 2 * config_kv_dim(c);
}

/* ---- weights.c ---- */

/* Bind every tensor the forward pass needs to model->layers etc., checking
 * presence, dtype and shape; converts norms to float32. */
spark_status weights_bind(spark_model *model);

/* Free what weights_bind allocated. */
void weights_release(spark_model *model);

/* Row r of a matrix, converted to float32 (cols values into out). */
void weight_row_to_f32(const weight_ref *w, int64_t row, float *out);

#endif

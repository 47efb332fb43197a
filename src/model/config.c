/*
 * config.c — the spark2_5 hyper-parameters, read from an HF config.json or
 * from GGUF metadata, and the checks that refuse what the forward pass
 * cannot honour.
 *
 * Nothing is guessed: a missing field is an error naming the field, except
 * where SPEC gives the published model's fixed choice and the format has no
 * field for it (GGUF carries no gate or activation keys: the architecture
 * name `spark2_5` implies them).
 */
#include "model/model.h"

#include "base/error.h"
#include "base/mem.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- HF config.json ---------------------------------------------------- */

/* Read a whole small text file (config.json) into a NUL-terminated buffer. */
static spark_status read_text_file(const char *path, size_t max_bytes, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return spark_fail(SPARK_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *grown = cap > max_bytes + 8192 ? NULL : realloc(buf, cap);
            if (!grown) {
                free(buf);
                fclose(f);
                return spark_fail(SPARK_ERR_FORMAT, "%s: unreadable or larger than %zu bytes", path, max_bytes);
            }
            buf = grown;
        }
        size_t got = fread(buf + len, 1, 4096, f);
        len += got;
        if (got < 4096) break;
    }
    fclose(f);
    buf[len] = '\0';
    *out = buf;
    return SPARK_OK;
}

typedef struct hf_reader {
    const char *path;
    const cJSON *root;
} hf_reader;

static spark_status hf_number(const hf_reader *r, const cJSON *obj, const char *field, double *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!item) return spark_fail(SPARK_ERR_MISSING, "%s: missing field '%s'", r->path, field);
    if (!cJSON_IsNumber(item))
        return spark_fail(SPARK_ERR_FORMAT, "%s: field '%s' must be a number", r->path, field);
    *out = item->valuedouble;
    return SPARK_OK;
}

static spark_status hf_int(const hf_reader *r, const char *field, int32_t *out)
{
    double v;
    TRY(hf_number(r, r->root, field, &v));
    if (v != floor(v) || v < 0 || v > 2147483647.0)
        return spark_fail(SPARK_ERR_FORMAT, "%s: field '%s' = %g is not a non-negative 32-bit integer",
                          r->path, field, v);
    *out = (int32_t)v;
    return SPARK_OK;
}

static spark_status hf_optional_int(const hf_reader *r, const char *field, int32_t fallback, int32_t *out)
{
    if (!cJSON_GetObjectItemCaseSensitive(r->root, field)) {
        *out = fallback;
        return SPARK_OK;
    }
    return hf_int(r, field, out);
}

/* A boolean field that must have one value for us to run the model;
 * absence counts as `absent_means`. */
static spark_status hf_require_bool(const hf_reader *r, const char *field, int absent_means, int required)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(r->root, field);
    int value = absent_means;
    if (item) {
        if (!cJSON_IsBool(item))
            return spark_fail(SPARK_ERR_FORMAT, "%s: field '%s' must be true or false", r->path, field);
        value = cJSON_IsTrue(item);
    }
    if (value != required)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: '%s' is %s; spark2_5 as this runtime computes it needs %s",
                          r->path, field, value ? "true" : "false", required ? "true" : "false");
    return SPARK_OK;
}

static spark_status hf_require_string(const hf_reader *r, const char *field, const char *const *allowed,
                                      int required_present)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(r->root, field);
    if (!item) {
        if (required_present) return spark_fail(SPARK_ERR_MISSING, "%s: missing field '%s'", r->path, field);
        return SPARK_OK;
    }
    if (!cJSON_IsString(item))
        return spark_fail(SPARK_ERR_FORMAT, "%s: field '%s' must be a string", r->path, field);
    for (int i = 0; allowed[i]; i++)
        if (!strcmp(item->valuestring, allowed[i])) return SPARK_OK;
    return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: %s = \"%s\" is not supported (expected \"%s\")", r->path,
                      field, item->valuestring, allowed[0]);
}

static spark_status hf_layer_types(const hf_reader *r, int32_t n_layer, uint8_t **layer_kind)
{
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(r->root, "layer_types");
    if (!types) return spark_fail(SPARK_ERR_MISSING, "%s: missing field 'layer_types'", r->path);
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != n_layer)
        return spark_fail(SPARK_ERR_FORMAT, "%s: 'layer_types' must be a list of %d strings (num_hidden_layers)",
                          r->path, n_layer);
    uint8_t *kinds = spark_calloc((size_t)n_layer, 1, "layer kinds");
    if (!kinds) return SPARK_ERR_NOMEM;
    int i = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, types)
    {
        const char *s = cJSON_IsString(item) ? item->valuestring : "";
        if (!strcmp(s, "full_attention")) {
            kinds[i] = SPARK_LAYER_FULL;
        } else if (!strcmp(s, "sliding_attention")) {
            kinds[i] = SPARK_LAYER_SLIDING;
        } else {
            free(kinds);
            return spark_fail(SPARK_ERR_UNSUPPORTED,
                              "%s: layer_types[%d] = \"%s\" (expected \"full_attention\" or \"sliding_attention\")",
                              r->path, i, s);
        }
        i++;
    }
    *layer_kind = kinds;
    return SPARK_OK;
}

/* rope_parameters.{full_attention,sliding_attention}.{rope_theta,partial_rotary_factor} */
static spark_status hf_rope_class(const hf_reader *r, const char *cls, int32_t head_dim, float *theta,
                                  int32_t *dims)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(r->root, "rope_parameters");
    if (!params || !cJSON_IsObject(params))
        return spark_fail(SPARK_ERR_MISSING, "%s: missing object 'rope_parameters' (per layer class rope)", r->path);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(params, cls);
    if (!c || !cJSON_IsObject(c))
        return spark_fail(SPARK_ERR_MISSING, "%s: missing 'rope_parameters.%s'", r->path, cls);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "rope_type");
    if (type && cJSON_IsString(type) && strcmp(type->valuestring, "default"))
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: rope_parameters.%s.rope_type = \"%s\" (only \"default\")",
                          r->path, cls, type->valuestring);
    double t, factor = 1.0;
    char field[96];
    snprintf(field, sizeof field, "rope_parameters.%s.rope_theta", cls);
    hf_reader sub = {r->path, c};
    spark_status st = hf_number(&sub, c, "rope_theta", &t);
    if (st != SPARK_OK) return spark_fail(st, "%s: missing or bad '%s'", r->path, field);
    if (cJSON_GetObjectItemCaseSensitive(c, "partial_rotary_factor")) TRY(hf_number(&sub, c, "partial_rotary_factor", &factor));
    double d = factor * head_dim;
    if (!(t > 0) || !(factor > 0 && factor <= 1.0) || d != floor(d))
        return spark_fail(SPARK_ERR_FORMAT, "%s: rope_parameters.%s: theta %g / partial_rotary_factor %g do not give a "
                          "whole number of dims of head_dim %d", r->path, cls, t, factor, head_dim);
    *theta = (float)t;
    *dims = (int32_t)d;
    return SPARK_OK;
}

static spark_status hf_fill(const hf_reader *r, spark_model_config *cfg, uint8_t **layer_kind, int *tied_head)
{
    static const char *const model_types[] = {"spark2_5", NULL};
    static const char *const acts[] = {"gelu", NULL};
    static const char *const gate_modes[] = {"sigmoid", NULL};
    TRY(hf_require_string(r, "model_type", model_types, 1));
    TRY(hf_require_string(r, "hidden_act", acts, 1));
    TRY(hf_require_string(r, "gate_attn_act_mode", gate_modes, 0));
    TRY(hf_require_bool(r, "headwise_attn_output_gate", 1, 1));
    TRY(hf_require_bool(r, "attention_bias", 0, 0));
    TRY(hf_require_bool(r, "mlp_bias", 0, 0));
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(r->root, "tie_word_embeddings");
    *tied_head = !tie || cJSON_IsTrue(tie);

    TRY(hf_int(r, "hidden_size", &cfg->n_embd));
    TRY(hf_int(r, "intermediate_size", &cfg->n_ff));
    TRY(hf_int(r, "num_hidden_layers", &cfg->n_layer));
    TRY(hf_int(r, "num_attention_heads", &cfg->n_head));
    TRY(hf_int(r, "num_key_value_heads", &cfg->n_head_kv));
    TRY(hf_int(r, "head_dim", &cfg->head_dim));
    TRY(hf_int(r, "vocab_size", &cfg->n_vocab));
    TRY(hf_int(r, "max_position_embeddings", &cfg->max_ctx));
    TRY(hf_int(r, "sliding_window", &cfg->sliding_window));
    double eps;
    TRY(hf_number(r, r->root, "rms_norm_eps", &eps));
    cfg->rms_eps = (float)eps;
    TRY(hf_optional_int(r, "bos_token_id", 0, &cfg->bos_id));
    TRY(hf_optional_int(r, "eos_token_id", 1, &cfg->eos_id));
    TRY(hf_optional_int(r, "pad_token_id", 2, &cfg->pad_id));
    TRY(hf_rope_class(r, "full_attention", cfg->head_dim, &cfg->rope_theta_full, &cfg->rope_dim_full));
    TRY(hf_rope_class(r, "sliding_attention", cfg->head_dim, &cfg->rope_theta_sliding, &cfg->rope_dim_sliding));
    return hf_layer_types(r, cfg->n_layer, layer_kind);
}

spark_status config_from_hf(const char *config_path, spark_model_config *cfg, uint8_t **layer_kind, int *tied_head)
{
    memset(cfg, 0, sizeof *cfg);
    *layer_kind = NULL;
    char *text;
    TRY(read_text_file(config_path, 16u << 20, &text));
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return spark_fail(SPARK_ERR_FORMAT, "%s: not a JSON object", config_path);
    }
    hf_reader r = {config_path, root};
    spark_status st = hf_fill(&r, cfg, layer_kind, tied_head);
    cJSON_Delete(root);
    if (st != SPARK_OK) {
        free(*layer_kind);
        *layer_kind = NULL;
        return st;
    }
    cfg->layer_kind = *layer_kind;
    return config_validate(cfg, config_path);
}

/* ---- GGUF metadata ----------------------------------------------------- */

static spark_status gguf_int_key(const gguf_file *g, const char *suffix, int32_t *out)
{
    char key[128];
    snprintf(key, sizeof key, "spark2_5.%s", suffix);
    int64_t v;
    TRY(gguf_get_i64(g, key, &v));
    if (v < 0 || v > 2147483647)
        return spark_fail(SPARK_ERR_FORMAT, "%s: key '%s' = %lld is out of range", g->tensors.files[0].path, key,
                          (long long)v);
    *out = (int32_t)v;
    return SPARK_OK;
}

static spark_status gguf_float_key(const gguf_file *g, const char *suffix, float *out)
{
    char key[128];
    snprintf(key, sizeof key, "spark2_5.%s", suffix);
    double v;
    TRY(gguf_get_f64(g, key, &v));
    *out = (float)v;
    return SPARK_OK;
}

static spark_status gguf_optional_id(const gguf_file *g, const char *key, int32_t fallback, int32_t *out)
{
    int64_t v;
    spark_status st = gguf_get_i64(g, key, &v);
    if (st == SPARK_ERR_MISSING) {
        *out = fallback;
        return SPARK_OK;
    }
    if (st != SPARK_OK) return st;
    *out = (int32_t)v;
    return SPARK_OK;
}

/* `sliding_window_pattern`: one bool per layer, TRUE = SLIDING (SPEC §4 trap). */
static spark_status gguf_layer_kinds(const gguf_file *g, int32_t n_layer, uint8_t **layer_kind)
{
    const char *path = g->tensors.files[0].path;
    const gguf_kv *kv = gguf_find(g, "spark2_5.attention.sliding_window_pattern");
    if (!kv) return spark_fail(SPARK_ERR_MISSING, "%s: missing key 'spark2_5.attention.sliding_window_pattern'", path);
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_len != (uint64_t)n_layer ||
        (kv->arr_type != GGUF_TYPE_BOOL && kv->arr_type != GGUF_TYPE_UINT8 && kv->arr_type != GGUF_TYPE_INT8 &&
         kv->arr_type != GGUF_TYPE_INT32 && kv->arr_type != GGUF_TYPE_UINT32))
        return spark_fail(SPARK_ERR_FORMAT,
                          "%s: key 'spark2_5.attention.sliding_window_pattern' must be an array of %d bools "
                          "(block_count)", path, n_layer);
    uint8_t *kinds = spark_calloc((size_t)n_layer, 1, "layer kinds");
    if (!kinds) return SPARK_ERR_NOMEM;
    for (int32_t i = 0; i < n_layer; i++) {
        int64_t v = gguf_arr_i64(kv, (uint64_t)i);
        if (v != 0 && v != 1) {
            free(kinds);
            return spark_fail(SPARK_ERR_FORMAT, "%s: sliding_window_pattern[%d] = %lld is not a bool", path, i,
                              (long long)v);
        }
        kinds[i] = v ? SPARK_LAYER_SLIDING : SPARK_LAYER_FULL;
    }
    *layer_kind = kinds;
    return SPARK_OK;
}

static spark_status gguf_fill(const gguf_file *g, spark_model_config *cfg, uint8_t **layer_kind)
{
    const char *path = g->tensors.files[0].path;
    gguf_str arch;
    TRY(gguf_get_str(g, "general.architecture", &arch));
    if (arch.len != 8 || memcmp(arch.ptr, "spark2_5", 8))
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: general.architecture is \"%.*s\" (expected \"spark2_5\")", path,
                          (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    TRY(gguf_int_key(g, "block_count", &cfg->n_layer));
    TRY(gguf_int_key(g, "context_length", &cfg->max_ctx));
    TRY(gguf_int_key(g, "embedding_length", &cfg->n_embd));
    TRY(gguf_int_key(g, "feed_forward_length", &cfg->n_ff));
    TRY(gguf_int_key(g, "attention.head_count", &cfg->n_head));
    TRY(gguf_int_key(g, "attention.head_count_kv", &cfg->n_head_kv));
    TRY(gguf_int_key(g, "attention.key_length", &cfg->head_dim));
    int32_t value_length;
    TRY(gguf_int_key(g, "attention.value_length", &value_length));
    if (value_length != cfg->head_dim)
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: attention.value_length %d differs from key_length %d", path,
                          value_length, cfg->head_dim);
    TRY(gguf_float_key(g, "attention.layer_norm_rms_epsilon", &cfg->rms_eps));
    TRY(gguf_int_key(g, "attention.sliding_window", &cfg->sliding_window));
    /* The trap: freq_base is the FULL layers' theta, freq_base_swa the sliding one. */
    TRY(gguf_float_key(g, "rope.freq_base", &cfg->rope_theta_full));
    TRY(gguf_float_key(g, "rope.freq_base_swa", &cfg->rope_theta_sliding));
    TRY(gguf_int_key(g, "rope.dimension_count", &cfg->rope_dim_full));
    TRY(gguf_int_key(g, "rope.dimension_count_swa", &cfg->rope_dim_sliding));
    spark_status st = gguf_int_key(g, "vocab_size", &cfg->n_vocab);
    if (st == SPARK_ERR_MISSING) {
        const tensor_info *emb = tensor_dir_find(&g->tensors, "token_embd.weight");
        if (!emb || emb->n_dims != 2)
            return spark_fail(SPARK_ERR_MISSING, "%s: no 'spark2_5.vocab_size' key and no 2-D token_embd.weight", path);
        cfg->n_vocab = (int32_t)emb->shape[0];
    } else if (st != SPARK_OK) {
        return st;
    }
    TRY(gguf_optional_id(g, "tokenizer.ggml.bos_token_id", 0, &cfg->bos_id));
    TRY(gguf_optional_id(g, "tokenizer.ggml.eos_token_id", 1, &cfg->eos_id));
    TRY(gguf_optional_id(g, "tokenizer.ggml.padding_token_id", 2, &cfg->pad_id));
    return gguf_layer_kinds(g, cfg->n_layer, layer_kind);
}

spark_status config_from_gguf(const gguf_file *g, spark_model_config *cfg, uint8_t **layer_kind)
{
    memset(cfg, 0, sizeof *cfg);
    *layer_kind = NULL;
    spark_status st = gguf_fill(g, cfg, layer_kind);
    if (st != SPARK_OK) {
        free(*layer_kind);
        *layer_kind = NULL;
        return st;
    }
    cfg->layer_kind = *layer_kind;
    return config_validate(cfg, g->tensors.files[0].path);
}

/* ---- validation -------------------------------------------------------- */

#define REQUIRE(cond, ...)                                                                     \
    do {                                                                                       \
        if (!(cond)) return spark_fail(SPARK_ERR_UNSUPPORTED, __VA_ARGS__);                    \
    } while (0)

spark_status config_validate(const spark_model_config *c, const char *source)
{
    REQUIRE(c->n_layer > 0 && c->n_layer <= 4096, "%s: layer count %d out of range", source, c->n_layer);
    REQUIRE(c->n_embd > 0 && c->n_embd <= (1 << 20), "%s: hidden size %d out of range", source, c->n_embd);
    REQUIRE(c->n_ff > 0 && c->n_ff <= (1 << 22), "%s: intermediate size %d out of range", source, c->n_ff);
    REQUIRE(c->n_head > 0 && c->n_head_kv > 0 && c->n_head % c->n_head_kv == 0,
            "%s: %d query heads are not a multiple of %d kv heads", source, c->n_head, c->n_head_kv);
    REQUIRE(c->head_dim > 0 && c->head_dim % 2 == 0 && c->head_dim <= 4096, "%s: head_dim %d must be even and > 0",
            source, c->head_dim);
    REQUIRE(c->n_vocab > 0, "%s: vocab size %d must be > 0", source, c->n_vocab);
    REQUIRE(c->max_ctx > 0, "%s: context length %d must be > 0", source, c->max_ctx);
    REQUIRE(c->rope_dim_full > 0 && c->rope_dim_full % 2 == 0 && c->rope_dim_full <= c->head_dim,
            "%s: full-layer rope dims %d must be even, > 0 and <= head_dim %d", source, c->rope_dim_full, c->head_dim);
    REQUIRE(c->rope_dim_sliding > 0 && c->rope_dim_sliding % 2 == 0 && c->rope_dim_sliding <= c->head_dim,
            "%s: sliding-layer rope dims %d must be even, > 0 and <= head_dim %d", source, c->rope_dim_sliding,
            c->head_dim);
    REQUIRE(c->rope_theta_full > 0 && c->rope_theta_sliding > 0, "%s: rope theta must be > 0", source);
    REQUIRE(c->rms_eps > 0 && isfinite(c->rms_eps), "%s: rms_norm_eps %g must be > 0", source, c->rms_eps);
    int any_sliding = 0;
    for (int i = 0; i < c->n_layer; i++) any_sliding |= c->layer_kind[i] == SPARK_LAYER_SLIDING;
    REQUIRE(!any_sliding || c->sliding_window > 0, "%s: sliding layers need sliding_window > 0 (got %d)", source,
            c->sliding_window);
    REQUIRE(c->bos_id >= 0 && c->eos_id >= 0 && c->bos_id < c->n_vocab && c->eos_id < c->n_vocab,
            "%s: bos/eos ids %d/%d outside the vocabulary of %d", source, c->bos_id, c->eos_id, c->n_vocab);
    return SPARK_OK;
}

/*
 * hf_meta.c — GGUF metadata for a Hugging Face spark2_5 directory.
 *
 * Hyper-parameters come from the model's validated config (so a converted
 * file reads back with the same numbers); the tokenizer is taken from
 * tokenizer.json: ids from model.vocab plus added_tokens (type 3 control
 * when "special", 4 user-defined), holes in the id space as "[PADn]" of
 * type 5 (unused), merges joined "a b", and the chat template from
 * tokenizer_config.json's "chat_template" or chat_template.jinja.
 */
#include "model/hf_meta.h"

#include "base/error.h"
#include "base/mem.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_USER = 4, TOKEN_UNUSED = 5 };

/* The whole file, NUL-terminated (malloc'ed), or NULL when it cannot be read. */
static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
                free(buf);
                buf = NULL;
            } else {
                buf[n] = '\0';
                if (len) *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return buf;
}

static spark_status write_hparams(gguf_writer *w, const spark_model *m)
{
    const spark_model_config *c = &m->cfg;
    static const struct {
        const char *key;
        size_t field;
    } u32s[] = {
        {"spark2_5.block_count", offsetof(spark_model_config, n_layer)},
        {"spark2_5.context_length", offsetof(spark_model_config, max_ctx)},
        {"spark2_5.embedding_length", offsetof(spark_model_config, n_embd)},
        {"spark2_5.feed_forward_length", offsetof(spark_model_config, n_ff)},
        {"spark2_5.attention.head_count", offsetof(spark_model_config, n_head)},
        {"spark2_5.attention.head_count_kv", offsetof(spark_model_config, n_head_kv)},
        {"spark2_5.attention.key_length", offsetof(spark_model_config, head_dim)},
        {"spark2_5.attention.value_length", offsetof(spark_model_config, head_dim)},
        {"spark2_5.vocab_size", offsetof(spark_model_config, n_vocab)},
        {"spark2_5.attention.sliding_window", offsetof(spark_model_config, sliding_window)},
        {"spark2_5.rope.dimension_count", offsetof(spark_model_config, rope_dim_full)},
        {"spark2_5.rope.dimension_count_swa", offsetof(spark_model_config, rope_dim_sliding)},
    };
    for (size_t i = 0; i < sizeof u32s / sizeof u32s[0]; i++) {
        int32_t v;
        memcpy(&v, (const char *)c + u32s[i].field, sizeof v);
        TRY(gguf_writer_set_u32(w, u32s[i].key, (uint32_t)v));
    }
    TRY(gguf_writer_set_f32(w, "spark2_5.attention.layer_norm_rms_epsilon", c->rms_eps));
    TRY(gguf_writer_set_f32(w, "spark2_5.rope.freq_base", c->rope_theta_full)); /* the FULL-layer theta */
    TRY(gguf_writer_set_f32(w, "spark2_5.rope.freq_base_swa", c->rope_theta_sliding));
    uint8_t *sliding = malloc((size_t)c->n_layer);
    if (!sliding) return spark_fail(SPARK_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->n_layer; i++) sliding[i] = c->layer_kind[i] == SPARK_LAYER_SLIDING; /* true = sliding */
    spark_status st =
        gguf_writer_set_array(w, "spark2_5.attention.sliding_window_pattern", GGUF_TYPE_BOOL, sliding, (uint64_t)c->n_layer);
    free(sliding);
    TRY(st);
    TRY(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id));
    TRY(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_id));
    TRY(gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)c->pad_id));
    TRY(gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 0));
    return gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", 0);
}

/* ---- tokenizer.json ------------------------------------------------------------------- */

typedef struct vocab_table {
    char **text;    /* per id; NULL = hole */
    int32_t *type;
    int32_t n;
    char pad[32];
} vocab_table;

static spark_status vocab_put(vocab_table *v, const char *path, int64_t id, const char *text, int32_t type)
{
    if (id < 0 || id >= v->n)
        return spark_fail(SPARK_ERR_FORMAT, "%s: token id %lld is outside the vocabulary of %d", path, (long long)id, v->n);
    v->text[id] = (char *)text; /* points into the cJSON tree, which outlives the table */
    v->type[id] = type;
    return SPARK_OK;
}

static spark_status fill_vocab(vocab_table *v, const cJSON *root, const char *path)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return spark_fail(SPARK_ERR_FORMAT, "%s: no model.vocab object", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e)) return spark_fail(SPARK_ERR_FORMAT, "%s: model.vocab['%s'] is not a number", path, e->string);
        TRY(vocab_put(v, path, (int64_t)e->valuedouble, e->string, TOKEN_NORMAL));
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(content))
            return spark_fail(SPARK_ERR_FORMAT, "%s: an added_tokens entry lacks id or content", path);
        int special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
        TRY(vocab_put(v, path, (int64_t)id->valuedouble, content->valuestring, special ? TOKEN_CONTROL : TOKEN_USER));
    }
    return SPARK_OK;
}

static spark_status write_tokens(gguf_writer *w, const vocab_table *v)
{
    gguf_str *items = spark_calloc((size_t)v->n, sizeof *items, "token strings");
    char *holes = spark_calloc((size_t)v->n, 16, "token hole names");
    spark_status st = items && holes ? SPARK_OK : SPARK_ERR_NOMEM;
    int32_t *types = st == SPARK_OK ? spark_calloc((size_t)v->n, sizeof *types, "token types") : NULL;
    if (st == SPARK_OK && !types) st = SPARK_ERR_NOMEM;
    for (int32_t i = 0; st == SPARK_OK && i < v->n; i++) {
        if (v->text[i]) {
            items[i] = (gguf_str){v->text[i], strlen(v->text[i])};
            types[i] = v->type[i];
        } else {
            int len = snprintf(holes + 16 * (size_t)i, 16, "[PAD%d]", i);
            items[i] = (gguf_str){holes + 16 * (size_t)i, (uint64_t)len};
            types[i] = TOKEN_UNUSED;
        }
    }
    if (st == SPARK_OK) st = gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", items, (uint64_t)v->n);
    if (st == SPARK_OK) st = gguf_writer_set_array(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)v->n);
    free(items);
    free(holes);
    free(types);
    return st;
}

/* merges: "a b" strings or ["a", "b"] pairs; pairs are joined into `joined`. */
static spark_status write_merges(gguf_writer *w, const cJSON *root, const char *path)
{
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "merges");
    int n = cJSON_GetArraySize(merges);
    if (n <= 0) return SPARK_OK;
    gguf_str *items = spark_calloc((size_t)n, sizeof *items, "merges");
    char **joined = spark_calloc((size_t)n, sizeof *joined, "merges");
    spark_status st = items && joined ? SPARK_OK : SPARK_ERR_NOMEM;
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges)
    {
        if (st != SPARK_OK) break;
        if (cJSON_IsString(e)) {
            items[i] = (gguf_str){e->valuestring, strlen(e->valuestring)};
        } else if (cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            const char *a = cJSON_GetArrayItem(e, 0)->valuestring, *b = cJSON_GetArrayItem(e, 1)->valuestring;
            size_t len = strlen(a) + 1 + strlen(b);
            if (!(joined[i] = malloc(len + 1))) st = spark_fail(SPARK_ERR_NOMEM, "out of memory");
            else {
                snprintf(joined[i], len + 1, "%s %s", a, b);
                items[i] = (gguf_str){joined[i], len};
            }
        } else {
            st = spark_fail(SPARK_ERR_FORMAT, "%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        }
        i++;
    }
    if (st == SPARK_OK) st = gguf_writer_set_str_array(w, "tokenizer.ggml.merges", items, (uint64_t)n);
    for (int k = 0; joined && k < n; k++) free(joined[k]);
    free(joined);
    free(items);
    return st;
}

static spark_status write_chat_template(gguf_writer *w, const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *text = read_text(path, NULL);
    spark_status st = SPARK_OK;
    int done = 0;
    if (text) {
        cJSON *cfg = cJSON_Parse(text);
        const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (cJSON_IsString(tpl)) {
            st = gguf_writer_set_str(w, "tokenizer.chat_template", tpl->valuestring, strlen(tpl->valuestring));
            done = 1;
        }
        cJSON_Delete(cfg);
        free(text);
    }
    if (done || st != SPARK_OK) return st;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    size_t len = 0;
    if (!(text = read_text(path, &len))) return SPARK_OK;
    st = gguf_writer_set_str(w, "tokenizer.chat_template", text, len);
    free(text);
    return st;
}

static spark_status write_tokenizer(gguf_writer *w, const spark_model *m, const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *text = read_text(path, NULL);
    if (!text) return SPARK_OK; /* a checkpoint without a tokenizer: weights only */
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return spark_fail(SPARK_ERR_FORMAT, "%s: not valid JSON", path);
    vocab_table v = {.n = m->cfg.n_vocab};
    v.text = spark_calloc((size_t)v.n, sizeof *v.text, "vocabulary");
    v.type = spark_calloc((size_t)v.n, sizeof *v.type, "vocabulary");
    spark_status st = v.text && v.type ? fill_vocab(&v, root, path) : SPARK_ERR_NOMEM;
    if (st == SPARK_OK) st = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", 4);
    if (st == SPARK_OK) st = gguf_writer_set_str(w, "tokenizer.ggml.pre", "spark2_5", 8);
    if (st == SPARK_OK) st = write_tokens(w, &v);
    if (st == SPARK_OK) st = write_merges(w, root, path);
    if (st == SPARK_OK) st = write_chat_template(w, dir);
    free(v.text);
    free(v.type);
    cJSON_Delete(root);
    return st;
}

spark_status hf_meta_write(gguf_writer *w, const spark_model *m, const char *dir, uint32_t file_type)
{
    const char *name = strrchr(dir, '/');
    name = name && name[1] ? name + 1 : dir;
    TRY(gguf_writer_set_str(w, "general.architecture", "spark2_5", 8));
    TRY(gguf_writer_set_str(w, "general.name", name, strlen(name)));
    TRY(gguf_writer_set_u32(w, "general.file_type", file_type));
    TRY(gguf_writer_set_u32(w, "general.quantization_version", 2));
    TRY(write_hparams(w, m));
    return write_tokenizer(w, m, dir);
}

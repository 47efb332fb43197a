/*
 * vocab_gguf.c — build a tokenizer from GGUF `tokenizer.ggml.*` metadata
 * (SPEC §4): model "gpt2" (byte-level BPE), pre "spark2_5", tokens,
 * token_type, merges ("a b" strings), bos/eos/padding/unknown ids and
 * add_bos_token.
 *
 * Token types follow llama.cpp: 3 = control (an added token that is
 * special), 4 = user-defined (an added token that is not special); both are
 * matched whole in raw text, like HF added tokens. The GGUF carries no
 * pre-tokenizer regexes, only its name, so the name selects the built-in
 * SPEC §5 pipeline; an unknown name is refused rather than guessed.
 */
#include "tokenizer/tokenizer.h"

#include "io/gguf.h"

#include <string.h>

enum { GGUF_TOKEN_CONTROL = 3, GGUF_TOKEN_USER_DEFINED = 4 };

static spark_status get_array(const gguf_file *g, const char *path, const char *key, gguf_type type,
                              bool required, const gguf_kv **out)
{
    const gguf_kv *kv = gguf_find(g, key);
    *out = NULL;
    if (!kv) return required ? spark_fail(SPARK_ERR_MISSING, "%s: key %s missing", path, key) : SPARK_OK;
    if (kv->type != GGUF_TYPE_ARRAY || (type != GGUF_TYPE_COUNT && kv->arr_type != type))
        return spark_fail(SPARK_ERR_FORMAT, "%s: key %s is not an array of %s", path, key,
                          type == GGUF_TYPE_COUNT ? "integers" : gguf_type_name(type));
    *out = kv;
    return SPARK_OK;
}

static spark_status check_kind(const gguf_file *g, const char *path, pretok *pre)
{
    gguf_str model, name;
    TRY(gguf_get_str(g, "tokenizer.ggml.model", &model));
    if (model.len != 4 || memcmp(model.ptr, "gpt2", 4))
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model is \"%.*s\", only \"gpt2\" (byte-level BPE) is supported",
                          path, (int)model.len, model.ptr);
    TRY(gguf_get_str(g, "tokenizer.ggml.pre", &name));
    if (name.len != 8 || memcmp(name.ptr, "spark2_5", 8))
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre is \"%.*s\", only \"spark2_5\" is supported",
                          path, (int)name.len, name.ptr);
    return pretok_init_spark(pre);
}

static spark_status load_tokens(tok_builder *b, const gguf_file *g, const char *path)
{
    const gguf_kv *tokens, *types;
    TRY(get_array(g, path, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, true, &tokens));
    TRY(get_array(g, path, "tokenizer.ggml.token_type", GGUF_TYPE_COUNT, false, &types));
    if (tokens->arr_len >= (1u << 24))
        return spark_fail(SPARK_ERR_FORMAT, "%s: %llu tokens is too many", path, (unsigned long long)tokens->arr_len);
    if (types && types->arr_len != tokens->arr_len)
        return spark_fail(SPARK_ERR_FORMAT, "%s: token_type has %llu entries for %llu tokens", path,
                          (unsigned long long)types->arr_len, (unsigned long long)tokens->arr_len);
    for (uint64_t i = 0; i < tokens->arr_len; i++) {
        gguf_str s = gguf_arr_str(tokens, i);
        TRY(tok_builder_set_token(b, (int32_t)i, s.ptr, s.len));
    }
    for (uint64_t i = 0; types && i < types->arr_len; i++) {
        int64_t ty = gguf_arr_i64(types, i);
        if ((ty == GGUF_TOKEN_CONTROL || ty == GGUF_TOKEN_USER_DEFINED) && b->tok->text_len[i] > 0)
            TRY(tok_builder_set_added(b, (int32_t)i, ty == GGUF_TOKEN_CONTROL));
    }
    return SPARK_OK;
}

static spark_status load_merges(tok_builder *b, const gguf_file *g, const char *path)
{
    const gguf_kv *merges;
    TRY(get_array(g, path, "tokenizer.ggml.merges", GGUF_TYPE_STRING, true, &merges));
    for (uint64_t i = 0; i < merges->arr_len; i++) {
        gguf_str s = gguf_arr_str(merges, i);
        const char *sp = s.len ? memchr(s.ptr, ' ', s.len) : NULL;
        if (!sp)
            return spark_fail(SPARK_ERR_FORMAT, "%s: tokenizer.ggml.merges[%llu] is not \"a b\"", path,
                              (unsigned long long)i);
        size_t ll = (size_t)(sp - s.ptr);
        TRY(tok_builder_add_merge(b, s.ptr, ll, sp + 1, s.len - ll - 1));
    }
    return SPARK_OK;
}

/* An optional id key: absent leaves *id alone; present must be a valid id. */
static spark_status load_id(const gguf_file *g, const char *path, const char *key, int32_t n_vocab, int32_t *id)
{
    int64_t v;
    spark_status st = gguf_get_i64(g, key, &v);
    if (st == SPARK_ERR_MISSING) return SPARK_OK;
    TRY(st);
    if (v < 0 || v >= n_vocab) return spark_fail(SPARK_ERR_FORMAT, "%s: %s = %lld is outside the vocabulary", path, key, (long long)v);
    *id = (int32_t)v;
    return SPARK_OK;
}

static spark_status load_specials(spark_tokenizer *t, const gguf_file *g, const char *path)
{
    TRY(load_id(g, path, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos_id));
    TRY(load_id(g, path, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos_id));
    TRY(load_id(g, path, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad_id));
    TRY(load_id(g, path, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk_id));
    bool add_bos;
    spark_status st = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
    if (st == SPARK_OK) t->add_bos = add_bos;
    else if (st != SPARK_ERR_MISSING) return st;
    return SPARK_OK;
}

spark_status tok_load_gguf(const char *path, spark_tokenizer **out)
{
    gguf_file g;
    tok_builder b;
    spark_status st = gguf_open(path, &g);
    if (st != SPARK_OK) return st;
    st = tok_builder_init(&b, path, 0);
    if (st == SPARK_OK) st = check_kind(&g, path, &b.tok->pre);
    if (st == SPARK_OK) st = load_tokens(&b, &g, path);
    if (st == SPARK_OK) st = tok_builder_index_vocab(&b);
    if (st == SPARK_OK) st = load_merges(&b, &g, path);
    if (st == SPARK_OK) st = load_specials(b.tok, &g, path);
    if (st == SPARK_OK) st = tok_builder_finish(&b, out);
    if (st != SPARK_OK) tok_builder_abort(&b);
    gguf_close(&g);
    return st;
}

/*
 * vocab_load.c — build a tokenizer from an HF tokenizer.json (and the
 * optional tokenizer_config.json beside it).
 *
 * Only what this runtime implements is accepted: a BPE model without
 * dropout / subword prefixes / byte fallback, no normalizer (or an empty
 * Sequence), and a pre-tokenizer made of Split(Isolated) and
 * Digits(individual) steps ending in ByteLevel(use_regex = false). Anything
 * else is refused by name (SPARK_ERR_UNSUPPORTED) rather than encoded
 * differently from the reference.
 */
#include "tokenizer/tokenizer.h"

#include "base/mem.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

spark_status tok_read_file(const char *path, char **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return spark_fail(SPARK_ERR_IO, "%s: cannot open", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = cap ? cap * 2 : 1 << 20;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf), fclose(f);
                return spark_fail(SPARK_ERR_NOMEM, "%s: out of memory reading", path);
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return spark_fail(SPARK_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *data = buf, *len = n;
    return SPARK_OK;
}

static spark_status parse_json_file(const char *path, cJSON **out)
{
    char *data;
    size_t len;
    TRY(tok_read_file(path, &data, &len));
    *out = cJSON_ParseWithLength(data, len);
    free(data);
    if (!*out) return spark_fail(SPARK_ERR_FORMAT, "%s: not valid JSON", path);
    return SPARK_OK;
}

static bool json_is_true(const cJSON *o, const char *key)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

static bool json_id(const cJSON *v, int32_t *id)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (1 << 24) ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return false;
    *id = (int32_t)v->valuedouble;
    return true;
}

/* ---- model section ------------------------------------------------------------- */

static spark_status check_model_options(const char *src, const cJSON *model)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE")))
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: model.type is not \"BPE\"", src);
    static const char *const must_be_null[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, must_be_null[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: model.%s is set (not supported)", src, must_be_null[i]);
    }
    if (json_is_true(model, "byte_fallback") || json_is_true(model, "ignore_merges"))
        return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: model.byte_fallback / ignore_merges not supported", src);
    return SPARK_OK;
}

static spark_status load_vocab(tok_builder *b, const char *src, const cJSON *model)
{
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return spark_fail(SPARK_ERR_MISSING, "%s: model.vocab missing", src);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id;
        if (!json_id(e, &id)) return spark_fail(SPARK_ERR_FORMAT, "%s: model.vocab[\"%s\"] is no valid id", src, e->string);
        TRY(tok_builder_set_token(b, id, e->string, strlen(e->string)));
    }
    return SPARK_OK;
}

static spark_status load_added(tok_builder *b, const char *src, const cJSON *root)
{
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!added || cJSON_IsNull(added)) return SPARK_OK;
    if (!cJSON_IsArray(added)) return spark_fail(SPARK_ERR_FORMAT, "%s: added_tokens is not an array", src);
    int i = 0;
    for (const cJSON *a = added->child; a; a = a->next, i++) {
        int32_t id;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!json_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &id) || !cJSON_IsString(content))
            return spark_fail(SPARK_ERR_FORMAT, "%s: added_tokens[%d] lacks id or content", src, i);
        if (json_is_true(a, "lstrip") || json_is_true(a, "rstrip") || json_is_true(a, "single_word"))
            return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: added token \"%s\" uses lstrip/rstrip/single_word",
                              src, content->valuestring);
        TRY(tok_builder_set_token(b, id, content->valuestring, strlen(content->valuestring)));
        TRY(tok_builder_set_added(b, id, json_is_true(a, "special")));
    }
    return SPARK_OK;
}

static spark_status load_merges(tok_builder *b, const char *src, const cJSON *model)
{
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!merges) return SPARK_OK;
    if (!cJSON_IsArray(merges)) return spark_fail(SPARK_ERR_FORMAT, "%s: model.merges is not an array", src);
    int i = 0;
    for (const cJSON *m = merges->child; m; m = m->next, i++) {
        const char *l, *r;
        size_t ll, rl;
        if (cJSON_IsString(m)) { /* old layout: "left right" */
            const char *sp = strchr(m->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return spark_fail(SPARK_ERR_FORMAT, "%s: model.merges[%d] is not \"a b\"", src, i);
            l = m->valuestring, ll = (size_t)(sp - l), r = sp + 1, rl = strlen(r);
        } else if (cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) && cJSON_IsString(m->child->next)) {
            l = m->child->valuestring, ll = strlen(l), r = m->child->next->valuestring, rl = strlen(r);
        } else {
            return spark_fail(SPARK_ERR_FORMAT, "%s: model.merges[%d] is not a pair", src, i);
        }
        TRY(tok_builder_add_merge(b, l, ll, r, rl));
    }
    return SPARK_OK;
}

/* ---- normalizer and pre-tokenizer --------------------------------------------- */

static spark_status check_normalizer(const char *src, const cJSON *norm)
{
    if (!norm || cJSON_IsNull(norm)) return SPARK_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(norm, "type");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(norm, "normalizers");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "Sequence") && cJSON_GetArraySize(list) == 0)
        return SPARK_OK;
    return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: a normalizer is configured (not supported)", src);
}

static spark_status add_pre_step(pretok *p, const char *src, const cJSON *step, bool *byte_level)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(step, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "?";
    if (*byte_level) return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: pre-tokenizer step after ByteLevel", src);
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(step, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(step, "behavior");
        if (!cJSON_IsString(re) || !cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") ||
            json_is_true(step, "invert"))
            return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: only Split {Regex, Isolated, invert=false} is supported", src);
        return pretok_add_regex(p, re->valuestring, strlen(re->valuestring), src);
    }
    if (!strcmp(ty, "Digits")) {
        if (!json_is_true(step, "individual_digits"))
            return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: Digits without individual_digits", src);
        return pretok_add_regex(p, "\\p{N}", 5, src);
    }
    if (!strcmp(ty, "ByteLevel")) {
        if (json_is_true(step, "add_prefix_space") || json_is_true(step, "use_regex"))
            return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: ByteLevel with add_prefix_space/use_regex", src);
        *byte_level = true;
        return SPARK_OK;
    }
    return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: pre-tokenizer step \"%s\" not supported", src, ty);
}

static spark_status load_pretokenizer(pretok *p, const char *src, const cJSON *pre)
{
    bool byte_level = false;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (!cJSON_IsString(type)) return spark_fail(SPARK_ERR_MISSING, "%s: pre_tokenizer missing", src);
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
        for (const cJSON *s = list ? list->child : NULL; s; s = s->next) TRY(add_pre_step(p, src, s, &byte_level));
    } else {
        TRY(add_pre_step(p, src, pre, &byte_level));
    }
    if (!byte_level) return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: pre-tokenizer does not end in ByteLevel", src);
    return SPARK_OK;
}

/* ---- tokenizer_config.json ------------------------------------------------------ */

/* A token given as "text" or {"content": "text"}; its id or -1. */
static int32_t config_token(const spark_tokenizer *t, const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return -1;
    return tok_lookup(t, v->valuestring, strlen(v->valuestring));
}

static void apply_config(spark_tokenizer *t, const cJSON *cfg)
{
    int32_t id;
    if ((id = config_token(t, cfg, "bos_token")) >= 0) t->bos_id = id;
    if ((id = config_token(t, cfg, "eos_token")) >= 0) t->eos_id = id;
    if ((id = config_token(t, cfg, "pad_token")) >= 0) t->pad_id = id;
    if ((id = config_token(t, cfg, "unk_token")) >= 0) t->unk_id = id;
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    if (cJSON_IsBool(ab)) t->add_bos = cJSON_IsTrue(ab);
}

/* Without a config, the Spark markers (SPEC §5) are the natural defaults. */
static void default_specials(spark_tokenizer *t)
{
    static const char *const bos = "<｜start▁of▁sentence｜>", *const eos = "<｜end▁of▁sentence｜>",
                             *const pad = "<｜▁pad▁｜>";
    t->bos_id = tok_lookup(t, bos, strlen(bos));
    t->eos_id = tok_lookup(t, eos, strlen(eos));
    t->pad_id = tok_lookup(t, pad, strlen(pad));
}

static spark_status load_root(tok_builder *b, const char *src, const cJSON *root)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return spark_fail(SPARK_ERR_MISSING, "%s: \"model\" missing", src);
    TRY(check_model_options(src, model));
    TRY(check_normalizer(src, cJSON_GetObjectItemCaseSensitive(root, "normalizer")));
    TRY(load_pretokenizer(&b->tok->pre, src, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")));
    TRY(load_vocab(b, src, model));
    TRY(load_added(b, src, root));
    TRY(tok_builder_index_vocab(b));
    TRY(load_merges(b, src, model));
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) b->tok->unk_id = tok_lookup(b->tok, unk->valuestring, strlen(unk->valuestring));
    return SPARK_OK;
}

spark_status tok_load_json(const char *json_path, const char *config_path, spark_tokenizer **out)
{
    tok_builder b;
    cJSON *root = NULL, *cfg = NULL;
    spark_status st = tok_builder_init(&b, json_path, 0);
    if (st == SPARK_OK) st = parse_json_file(json_path, &root);
    if (st == SPARK_OK) st = load_root(&b, json_path, root);
    if (st == SPARK_OK) {
        default_specials(b.tok);
        if (config_path) st = parse_json_file(config_path, &cfg);
        if (st == SPARK_OK && cfg) apply_config(b.tok, cfg);
    }
    if (st == SPARK_OK) st = tok_builder_finish(&b, out);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (st != SPARK_OK) tok_builder_abort(&b);
    return st;
}

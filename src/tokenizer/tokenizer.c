/*
 * tokenizer.c — the public handle: loading by path, accessors, free.
 *
 * A path may be an HF checkpoint directory (tokenizer.json, plus
 * tokenizer_config.json when present), a tokenizer.json file itself (its
 * directory's tokenizer_config.json is used when present), or a GGUF file
 * (recognised by its magic, whatever the name).
 */
#include "tokenizer/tokenizer.h"

#include "base/mem.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

spark_status tok_load_json(const char *json_path, const char *config_path, spark_tokenizer **out);
spark_status tok_load_gguf(const char *path, spark_tokenizer **out);
void tok_scratch_release(spark_tokenizer *t);

static bool is_gguf(const char *path)
{
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    if (!f) return false;
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* dir + "/" + name, malloc'ed. */
static char *join(const char *dir, size_t dir_len, const char *name)
{
    size_t n = dir_len + 1 + strlen(name) + 1;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%.*s/%s", (int)dir_len, dir, name);
    return p;
}

static spark_status load_json_at(const char *dir, size_t dir_len, const char *json_path, spark_tokenizer **out)
{
    char *cfg = join(dir, dir_len, "tokenizer_config.json");
    if (!cfg) return spark_fail(SPARK_ERR_NOMEM, "out of memory");
    spark_status st = tok_load_json(json_path, is_file(cfg) ? cfg : NULL, out);
    free(cfg);
    return st;
}

spark_status spark_tokenizer_load(const char *path, spark_tokenizer **out)
{
    if (!path || !out) return spark_fail(SPARK_ERR_ARG, "spark_tokenizer_load: NULL argument");
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return spark_fail(SPARK_ERR_IO, "%s: no such file or directory", path);
    if (S_ISDIR(st.st_mode)) {
        char *json = join(path, strlen(path), "tokenizer.json");
        if (!json) return spark_fail(SPARK_ERR_NOMEM, "out of memory");
        spark_status s = is_file(json) ? load_json_at(path, strlen(path), json, out)
                                       : spark_fail(SPARK_ERR_MISSING, "%s: no tokenizer.json in this directory", path);
        free(json);
        return s;
    }
    if (is_gguf(path)) return tok_load_gguf(path, out);
    const char *slash = strrchr(path, '/');
    return slash ? load_json_at(path, (size_t)(slash - path), path, out) : load_json_at(".", 1, path, out);
}

void spark_tokenizer_free(spark_tokenizer *t)
{
    if (!t) return;
    tok_scratch_release(t);
    pretok_free(&t->pre);
    free(t->text_off), free(t->text_len), free(t->text), free(t->flags);
    free(t->piece_off), free(t->piece);
    free(t->vocab.hash), free(t->vocab.id);
    free(t->merges.key), free(t->merges.rank);
    free(t->merge_left), free(t->merge_right), free(t->merge_new);
    free(t->added);
    free(t->source);
    free(t);
}

int32_t spark_tokenizer_n_vocab(const spark_tokenizer *t) { return t->n_vocab; }

int32_t spark_tokenizer_n_dead_merges(const spark_tokenizer *t) { return t->n_dead_merges; }

spark_tokenizer_specials spark_tokenizer_get_specials(const spark_tokenizer *t)
{
    return (spark_tokenizer_specials){t->bos_id, t->eos_id, t->pad_id, t->unk_id, t->add_bos};
}

int32_t spark_tokenizer_token_id(const spark_tokenizer *t, const char *s, size_t len)
{
    return s ? tok_lookup(t, s, len) : -1;
}

static bool valid_id(const spark_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKF_PRESENT);
}

const char *spark_tokenizer_token_text(const spark_tokenizer *t, int32_t id)
{
    return valid_id(t, id) ? t->text + t->text_off[id] : NULL;
}

const char *spark_tokenizer_token_piece(const spark_tokenizer *t, int32_t id, size_t *len)
{
    if (!valid_id(t, id)) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->piece_off[id + 1] - t->piece_off[id];
    return (const char *)t->piece + t->piece_off[id];
}

int spark_tokenizer_is_added(const spark_tokenizer *t, int32_t id)
{
    return valid_id(t, id) && (t->flags[id] & TOKF_ADDED);
}

int spark_tokenizer_is_special(const spark_tokenizer *t, int32_t id)
{
    return valid_id(t, id) && (t->flags[id] & TOKF_SPECIAL);
}

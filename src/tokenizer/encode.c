/*
 * encode.c — text to ids: UTF-8 repair, added-token split, then the
 * pre-tokenizer and BPE per plain segment.
 *
 * Added tokens are found in the raw text first, leftmost then longest (as
 * HF's added-vocabulary matcher does), and the text between them is
 * pre-tokenized on its own, so no piece ever straddles an added token. With
 * SPARK_ENCODE_PARSE_SPECIAL off the whole input is one plain segment.
 *
 * Scratch memory (regex match data, merge heap, piece cache) lives in the
 * tokenizer and is borrowed with a trylock; a concurrent caller gets a
 * private, cache-less scratch instead of waiting, so encode is thread-safe
 * and never blocks.
 */
#include "tokenizer/tokenizer.h"

#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

void spark_token_buf_free(spark_token_buf *buf)
{
    if (!buf) return;
    free(buf->ids);
    memset(buf, 0, sizeof *buf);
}

spark_status tok_buf_reserve(spark_token_buf *b, size_t extra)
{
    if (b->n + extra <= b->cap) return SPARK_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra) cap *= 2;
    int32_t *ids = realloc(b->ids, cap * sizeof *ids);
    if (!ids) return spark_fail(SPARK_ERR_NOMEM, "out of memory for %zu token ids", cap);
    b->ids = ids, b->cap = cap;
    return SPARK_OK;
}

/* ---- scratch ------------------------------------------------------------------ */

static spark_status scratch_init(tok_scratch *s, bool use_cache)
{
    memset(s, 0, sizeof *s);
    spark_status st = pretok_scratch_init(&s->pre);
    if (st == SPARK_OK) st = bpe_scratch_init(&s->bpe, use_cache);
    return st;
}

static void scratch_free(tok_scratch *s)
{
    pretok_scratch_free(&s->pre);
    bpe_scratch_free(&s->bpe);
    free(s->clean);
    memset(s, 0, sizeof *s);
}

/* The shared scratch, created on first use (NULL when busy or on failure). */
static tok_scratch *borrow_shared(spark_tokenizer *t)
{
    if (pthread_mutex_trylock(&t->scratch_lock) != 0) return NULL;
    if (!t->scratch.pre.md && scratch_init(&t->scratch, true) != SPARK_OK) {
        scratch_free(&t->scratch);
        pthread_mutex_unlock(&t->scratch_lock);
        return NULL;
    }
    return &t->scratch;
}

void tok_scratch_release(spark_tokenizer *t)
{
    pthread_mutex_lock(&t->scratch_lock);
    scratch_free(&t->scratch);
    pthread_mutex_unlock(&t->scratch_lock);
    pthread_mutex_destroy(&t->scratch_lock);
}

/* ---- encoding ----------------------------------------------------------------- */

typedef struct encode_run {
    const spark_tokenizer *t;
    tok_scratch *s;
    spark_token_buf *out;
} encode_run;

static int on_piece(void *ctx, const char *p, size_t len)
{
    encode_run *r = ctx;
    return (int)bpe_encode_piece(r->t, &r->s->bpe, (const uint8_t *)p, len, r->out);
}

static spark_status encode_plain(encode_run *r, const char *text, size_t len)
{
    if (len == 0) return SPARK_OK;
    return pretok_split(&r->t->pre, &r->s->pre, text, len, on_piece, r);
}

/* Longest added token starting at text[i], or NULL. */
static const tok_added *added_at(const spark_tokenizer *t, const char *text, size_t len, size_t i)
{
    uint8_t b = (uint8_t)text[i];
    for (int k = t->added_first[b]; k < t->added_first[b + 1]; k++) {
        const tok_added *a = &t->added[k];
        if (a->len <= len - i && memcmp(text + i, t->added_text + a->off, a->len) == 0) return a;
    }
    return NULL;
}

static spark_status encode_with_added(encode_run *r, const char *text, size_t len)
{
    const spark_tokenizer *t = r->t;
    size_t seg = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)text[i];
        if (t->added_first[b] == t->added_first[b + 1]) continue;
        const tok_added *a = added_at(t, text, len, i);
        if (!a) continue;
        TRY(encode_plain(r, text + seg, i - seg));
        TRY(tok_buf_reserve(r->out, 1));
        r->out->ids[r->out->n++] = a->id;
        i += a->len - 1;
        seg = i + 1;
    }
    return encode_plain(r, text + seg, len - seg);
}

/* Valid UTF-8 of the input: the input itself, or a repaired copy in s. */
static spark_status clean_input(tok_scratch *s, const char **text, size_t *len)
{
    if (utf8_valid((const uint8_t *)*text, *len)) return SPARK_OK;
    size_t need = utf8_repaired_len((const uint8_t *)*text, *len);
    if (need > s->clean_cap) {
        char *p = realloc(s->clean, need);
        if (!p) return spark_fail(SPARK_ERR_NOMEM, "out of memory repairing %zu bytes of input", *len);
        s->clean = p, s->clean_cap = need;
    }
    *len = utf8_repair((const uint8_t *)*text, *len, s->clean);
    *text = s->clean;
    return SPARK_OK;
}

static spark_status encode_in(const spark_tokenizer *t, tok_scratch *s, const char *text, size_t len,
                              uint32_t flags, spark_token_buf *out)
{
    encode_run r = {t, s, out};
    TRY(clean_input(s, &text, &len));
    if ((flags & SPARK_ENCODE_ADD_BOS) && t->bos_id >= 0) {
        TRY(tok_buf_reserve(out, 1));
        out->ids[out->n++] = t->bos_id;
    }
    if (flags & SPARK_ENCODE_PARSE_SPECIAL) return encode_with_added(&r, text, len);
    return encode_plain(&r, text, len);
}

spark_status spark_tokenizer_encode(const spark_tokenizer *tok, const char *text, size_t len,
                                    uint32_t flags, spark_token_buf *out)
{
    if (!tok || !out || (!text && len)) return spark_fail(SPARK_ERR_ARG, "spark_tokenizer_encode: NULL argument");
    spark_tokenizer *t = (spark_tokenizer *)tok; /* only the scratch is touched, under its lock */
    size_t n0 = out->n;
    tok_scratch *shared = borrow_shared(t), local;
    spark_status st;
    if (shared) {
        st = encode_in(t, shared, text, len, flags, out);
        pthread_mutex_unlock(&t->scratch_lock);
    } else {
        st = scratch_init(&local, false);
        if (st == SPARK_OK) st = encode_in(t, &local, text, len, flags, out);
        scratch_free(&local);
    }
    if (st != SPARK_OK) out->n = n0; /* all or nothing */
    return st;
}

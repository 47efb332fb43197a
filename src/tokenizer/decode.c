/*
 * decode.c — ids back to text, whole or streamed.
 *
 * Each id's bytes are precomputed (vocab.c), so decoding is concatenation
 * followed by UTF-8 repair: a byte run that is not valid UTF-8 (possible
 * when ids are cut mid-character, or for arbitrary id sequences) becomes
 * U+FFFD per maximal invalid subpart — what HF's decoder (Rust's
 * from_utf8_lossy) gives.
 *
 * The streaming detokenizer keeps the bytes of an unfinished character
 * between pushes and only releases text once it is decided: a complete
 * character, or an invalid subpart (which no later byte can make valid, so
 * it is replaced at once). Its output concatenated therefore equals the
 * whole-sequence decode, and every chunk is valid UTF-8 on its own.
 */
#include "tokenizer/tokenizer.h"

#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

static bool skipped(const spark_tokenizer *t, int32_t id, uint32_t flags)
{
    return (flags & SPARK_DECODE_SKIP_SPECIAL) && (t->flags[id] & TOKF_SPECIAL);
}

static spark_status check_id(const spark_tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab || !(t->flags[id] & TOKF_PRESENT))
        return spark_fail(SPARK_ERR_ARG, "token id %d is not in the vocabulary (%d ids)", id, t->n_vocab);
    return SPARK_OK;
}

spark_status spark_tokenizer_decode(const spark_tokenizer *t, const int32_t *ids, size_t n, uint32_t flags,
                                    char **text, size_t *len)
{
    if (!t || !text || (!ids && n)) return spark_fail(SPARK_ERR_ARG, "spark_tokenizer_decode: NULL argument");
    *text = NULL;
    size_t raw_len = 0;
    for (size_t i = 0; i < n; i++) {
        TRY(check_id(t, ids[i]));
        if (!skipped(t, ids[i], flags)) raw_len += t->piece_off[ids[i] + 1] - t->piece_off[ids[i]];
    }
    uint8_t *raw = malloc(raw_len + 1);
    if (!raw) return spark_fail(SPARK_ERR_NOMEM, "out of memory decoding %zu ids", n);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (skipped(t, ids[i], flags)) continue;
        uint32_t a = t->piece_off[ids[i]], b = t->piece_off[ids[i] + 1];
        memcpy(raw + o, t->piece + a, b - a);
        o += b - a;
    }
    if (utf8_valid(raw, o)) {
        raw[o] = '\0';
        *text = (char *)raw;
        if (len) *len = o;
        return SPARK_OK;
    }
    size_t need = utf8_repaired_len(raw, o);
    char *out = malloc(need + 1);
    if (!out) {
        free(raw);
        return spark_fail(SPARK_ERR_NOMEM, "out of memory decoding %zu ids", n);
    }
    size_t m = utf8_repair(raw, o, out);
    out[m] = '\0';
    free(raw);
    *text = out;
    if (len) *len = m;
    return SPARK_OK;
}

/* ---- streaming ------------------------------------------------------------------ */

struct spark_detokenizer {
    const spark_tokenizer *tok;
    uint32_t flags;
    uint8_t pending[4]; /* the start of a character not yet complete */
    size_t n_pending;
    char *out;          /* what the last call returns */
    size_t out_cap;
};

spark_status spark_detokenizer_create(const spark_tokenizer *tok, uint32_t flags, spark_detokenizer **out)
{
    if (!tok || !out) return spark_fail(SPARK_ERR_ARG, "spark_detokenizer_create: NULL argument");
    spark_detokenizer *d = spark_calloc(1, sizeof *d, "detokenizer");
    if (!d) return SPARK_ERR_NOMEM;
    d->tok = tok, d->flags = flags;
    *out = d;
    return SPARK_OK;
}

void spark_detokenizer_free(spark_detokenizer *d)
{
    if (!d) return;
    free(d->out);
    free(d);
}

static spark_status out_reserve(spark_detokenizer *d, size_t n)
{
    if (n + 1 <= d->out_cap) return SPARK_OK;
    size_t cap = d->out_cap ? d->out_cap : 64;
    while (cap < n + 1) cap *= 2;
    char *p = realloc(d->out, cap);
    if (!p) return spark_fail(SPARK_ERR_NOMEM, "out of memory in the detokenizer");
    d->out = p, d->out_cap = cap;
    return SPARK_OK;
}

/* Append the decided part of pending + bytes to d->out (from offset *o);
 * keep a valid but unfinished tail in pending. With `final`, the tail is
 * decided too (one U+FFFD, as a whole decode ends). */
static spark_status stream_bytes(spark_detokenizer *d, const uint8_t *bytes, size_t n, bool final, size_t *o)
{
    size_t len = d->n_pending + n;
    /* Worst case every byte becomes U+FFFD: 3 output bytes per input byte. */
    TRY(out_reserve(d, *o + 3 * len));
    uint8_t small[64], *q = len <= sizeof small ? small : malloc(len);
    if (!q) return spark_fail(SPARK_ERR_NOMEM, "out of memory in the detokenizer");
    memcpy(q, d->pending, d->n_pending);
    if (n) memcpy(q + d->n_pending, bytes, n);
    d->n_pending = 0;
    size_t p = 0;
    while (p < len) {
        if (q[p] < 0x80) {
            d->out[(*o)++] = (char)q[p++];
            continue;
        }
        size_t need, k = utf8_valid_prefix(q + p, len - p, &need);
        if (k && k == need) {
            memcpy(d->out + *o, q + p, k);
            *o += k, p += k;
        } else if (k && p + k == len && !final) {
            memcpy(d->pending, q + p, k); /* k < need <= 4 */
            d->n_pending = k;
            break;
        } else {
            memcpy(d->out + *o, "\xEF\xBF\xBD", 3);
            *o += 3, p += k ? k : 1;
        }
    }
    if (q != small) free(q);
    return SPARK_OK;
}

spark_status spark_detokenizer_push(spark_detokenizer *d, int32_t id, const char **text, size_t *len)
{
    if (!d || !text || !len) return spark_fail(SPARK_ERR_ARG, "spark_detokenizer_push: NULL argument");
    *text = "", *len = 0;
    TRY(check_id(d->tok, id));
    if (skipped(d->tok, id, d->flags)) return SPARK_OK;
    const spark_tokenizer *t = d->tok;
    size_t o = 0;
    TRY(stream_bytes(d, t->piece + t->piece_off[id], t->piece_off[id + 1] - t->piece_off[id], false, &o));
    d->out[o] = '\0';
    *text = d->out, *len = o;
    return SPARK_OK;
}

spark_status spark_detokenizer_flush(spark_detokenizer *d, const char **text, size_t *len)
{
    if (!d || !text || !len) return spark_fail(SPARK_ERR_ARG, "spark_detokenizer_flush: NULL argument");
    size_t o = 0;
    TRY(stream_bytes(d, NULL, 0, true, &o));
    d->out[o] = '\0';
    *text = d->out, *len = o;
    return SPARK_OK;
}

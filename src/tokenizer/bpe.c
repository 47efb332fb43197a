/*
 * bpe.c — the byte-level BPE merge loop for one pre-tokenized piece.
 *
 * A piece starts as one symbol per byte (the token of that byte's
 * byte-level character). Adjacent pairs that have a merge go into a binary
 * min-heap keyed (rank, position): the lowest rank merges first, leftmost
 * first among equals. This is the same order, and the same rule for stale
 * heap entries, as HF tokenizers' Word::merge_all — an entry is honoured only
 * if the pair now at its position would produce the same token — so the
 * result is identical even for merge tables with unusual orderings, and
 * the cost is O(n log n) instead of rescanning the piece after every merge.
 *
 * Pieces repeat a lot in real text (" the", "\n", "    "), so results are
 * cached by their bytes.
 */
#include "tokenizer/tokenizer.h"

#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

enum {
    CACHE_SLOTS = 1 << 16,
    CACHE_MAX_USED = CACHE_SLOTS / 2,
    CACHE_MAX_KEY = 128,           /* longer pieces are rare and not worth keeping */
    CACHE_MAX_BYTES = 4 << 20,
};

/* ---- cache ------------------------------------------------------------------ */

static void cache_free(bpe_cache *c)
{
    free(c->hash), free(c->key_off), free(c->key_len), free(c->ids_off), free(c->n_ids);
    free(c->keys), free(c->ids);
    memset(c, 0, sizeof *c);
}

static spark_status cache_init(bpe_cache *c)
{
    memset(c, 0, sizeof *c);
    c->hash = calloc(CACHE_SLOTS, sizeof *c->hash);
    c->key_off = malloc(CACHE_SLOTS * sizeof *c->key_off);
    c->key_len = malloc(CACHE_SLOTS * sizeof *c->key_len);
    c->ids_off = malloc(CACHE_SLOTS * sizeof *c->ids_off);
    c->n_ids = malloc(CACHE_SLOTS * sizeof *c->n_ids);
    c->keys_cap = CACHE_MAX_BYTES;
    c->ids_cap = CACHE_MAX_BYTES / sizeof(int32_t);
    c->keys = malloc(c->keys_cap);
    c->ids = malloc(c->ids_cap * sizeof *c->ids);
    c->mask = CACHE_SLOTS - 1;
    if (!c->hash || !c->key_off || !c->key_len || !c->ids_off || !c->n_ids || !c->keys || !c->ids) {
        cache_free(c);
        return spark_fail(SPARK_ERR_NOMEM, "out of memory for the BPE cache");
    }
    return SPARK_OK;
}

static void cache_clear(bpe_cache *c)
{
    memset(c->hash, 0, CACHE_SLOTS * sizeof *c->hash);
    c->used = 0, c->keys_len = 0, c->ids_len = 0;
}

/* Slot holding `key`, or the empty slot where it would go. */
static uint32_t cache_find(const bpe_cache *c, const uint8_t *key, size_t len, uint32_t h)
{
    uint32_t i = h & c->mask;
    while (c->hash[i]) {
        if (c->hash[i] == h && c->key_len[i] == len && memcmp(c->keys + c->key_off[i], key, len) == 0)
            break;
        i = (i + 1) & c->mask;
    }
    return i;
}

static void cache_put(bpe_cache *c, const uint8_t *key, size_t len, uint32_t h, const int32_t *ids,
                      size_t n)
{
    if (c->used >= CACHE_MAX_USED || c->keys_len + len > c->keys_cap || c->ids_len + n > c->ids_cap)
        cache_clear(c);
    uint32_t i = cache_find(c, key, len, h);
    if (c->hash[i]) return;
    memcpy(c->keys + c->keys_len, key, len);
    memcpy(c->ids + c->ids_len, ids, n * sizeof *ids);
    c->hash[i] = h;
    c->key_off[i] = (uint32_t)c->keys_len, c->key_len[i] = (uint32_t)len;
    c->ids_off[i] = (uint32_t)c->ids_len, c->n_ids[i] = (uint32_t)n;
    c->keys_len += len, c->ids_len += n, c->used++;
}

spark_status bpe_scratch_init(bpe_scratch *s, bool use_cache)
{
    memset(s, 0, sizeof *s);
    s->use_cache = use_cache;
    return use_cache ? cache_init(&s->cache) : SPARK_OK;
}

void bpe_scratch_free(bpe_scratch *s)
{
    free(s->sym), free(s->heap);
    cache_free(&s->cache);
    memset(s, 0, sizeof *s);
}

/* ---- heap ----------------------------------------------------------------- */

static void heap_push(bpe_scratch *s, uint64_t v)
{
    size_t i = s->heap_len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (s->heap[parent] <= v) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = v;
}

static uint64_t heap_pop(bpe_scratch *s)
{
    uint64_t top = s->heap[0], last = s->heap[--s->heap_len];
    size_t i = 0, n = s->heap_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && s->heap[c + 1] < s->heap[c]) c++;
        if (last <= s->heap[c]) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* ---- merge loop ------------------------------------------------------------ */

static spark_status reserve(bpe_scratch *s, size_t n)
{
    /* Each merge pushes at most two pairs: n - 1 initial + 2 (n - 1) <= 3n. */
    if (n > s->sym_cap) {
        size_t cap = n < 64 ? 64 : n * 2;
        bpe_symbol *sym = realloc(s->sym, cap * sizeof *sym);
        if (!sym) return spark_fail(SPARK_ERR_NOMEM, "out of memory for a %zu-byte piece", n);
        s->sym = sym;
        uint64_t *heap = realloc(s->heap, 3 * cap * sizeof *heap);
        if (!heap) return spark_fail(SPARK_ERR_NOMEM, "out of memory for a %zu-byte piece", n);
        s->heap = heap;
        s->sym_cap = cap;
    }
    return SPARK_OK;
}

static void push_pair(const spark_tokenizer *t, bpe_scratch *s, int32_t pos)
{
    int32_t next = s->sym[pos].next;
    if (next < 0) return;
    int32_t r = tok_merge_rank(t, s->sym[pos].id, s->sym[next].id);
    if (r >= 0) heap_push(s, ((uint64_t)r << 32) | (uint32_t)pos);
}

static spark_status init_symbols(const spark_tokenizer *t, bpe_scratch *s, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[b[i]];
        if (id < 0) id = t->unk_id; /* only for tokenizers lacking a byte symbol */
        if (id < 0)
            return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: byte 0x%02X has no token and there is no <unk>",
                              t->source, b[i]);
        s->sym[i] = (bpe_symbol){id, (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
    }
    return SPARK_OK;
}

static void merge_all(const spark_tokenizer *t, bpe_scratch *s, size_t n)
{
    s->heap_len = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, s, (int32_t)i);
    while (s->heap_len) {
        uint64_t top = heap_pop(s);
        int32_t rank = (int32_t)(top >> 32), pos = (int32_t)(uint32_t)top;
        bpe_symbol *a = &s->sym[pos];
        if (!a->alive || a->next < 0) continue;
        bpe_symbol *b = &s->sym[a->next];
        int32_t now = tok_merge_rank(t, a->id, b->id);
        int32_t new_id = t->merge_new[rank];
        if (now < 0 || t->merge_new[now] != new_id) continue; /* stale entry */
        a->id = new_id;
        b->alive = 0;
        a->next = b->next;
        if (a->next >= 0) s->sym[a->next].prev = pos;
        if (a->prev >= 0) push_pair(t, s, a->prev);
        push_pair(t, s, pos);
    }
}

spark_status bpe_encode_piece(const spark_tokenizer *t, bpe_scratch *s, const uint8_t *bytes,
                              size_t len, spark_token_buf *out)
{
    if (len == 0) return SPARK_OK;
    uint32_t h = 0, slot = 0;
    bool cacheable = s->use_cache && len > 1 && len <= CACHE_MAX_KEY;
    if (cacheable) {
        h = tok_hash_bytes(bytes, len);
        slot = cache_find(&s->cache, bytes, len, h);
        if (s->cache.hash[slot]) {
            uint32_t n = s->cache.n_ids[slot];
            TRY(tok_buf_reserve(out, n));
            memcpy(out->ids + out->n, s->cache.ids + s->cache.ids_off[slot], n * sizeof(int32_t));
            out->n += n;
            return SPARK_OK;
        }
    }
    TRY(reserve(s, len));
    TRY(init_symbols(t, s, bytes, len));
    merge_all(t, s, len);
    size_t start = out->n;
    for (int32_t i = 0; i >= 0; i = s->sym[i].next) {
        TRY(tok_buf_reserve(out, 1));
        out->ids[out->n++] = s->sym[i].id;
    }
    if (cacheable) cache_put(&s->cache, bytes, len, h, out->ids + start, out->n - start);
    return SPARK_OK;
}

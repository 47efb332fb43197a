/*
 * vocab.c — the tokenizer's tables and the builder both loaders share.
 *
 * Two hash maps make encoding cheap: token string -> id (used for the
 * single-byte symbols, added tokens and merge results at load time) and
 * (left id, right id) -> merge rank (used in the merge loop). Both are open
 * addressing over power-of-two tables at most half full. The decode table
 * (id -> bytes) is precomputed here so decoding is a copy.
 */
#include "tokenizer/tokenizer.h"

#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

uint32_t tok_hash_bytes(const void *data, size_t len)
{
    /* FNV-1a with a final avalanche; 0 is reserved for "empty slot". */
    const uint8_t *p = data;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 16777619u;
    h ^= h >> 16, h *= 0x7feb352d, h ^= h >> 15;
    return h ? h : 1;
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t s = 16;
    while (s < n) s <<= 1;
    return s;
}

/* ---- GPT-2 byte-level alphabet --------------------------------------------
 * Printable bytes (33..126, 161..172, 174..255) stand for themselves; the
 * other 68 bytes, in increasing order, get code points 256, 257, ... */

static bool byte_is_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t tok_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b)) return b;
    uint32_t n = 0;
    for (unsigned i = 0; i < b; i++) n += !byte_is_printable(i);
    return 256 + n;
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
    uint32_t n = 256;
    for (unsigned b = 0; b < 256; b++)
        if (!byte_is_printable(b) && n++ == cp) return (int)b;
    return -1;
}

/* ---- lookups ------------------------------------------------------------------ */

int32_t tok_lookup(const spark_tokenizer *t, const char *s, size_t len)
{
    if (!t->vocab.hash) return -1;
    uint32_t h = tok_hash_bytes(s, len);
    for (uint32_t i = h & t->vocab.mask;; i = (i + 1) & t->vocab.mask) {
        if (t->vocab.hash[i] == 0) return -1;
        if (t->vocab.hash[i] != h) continue;
        int32_t id = t->vocab.id[i];
        if (t->text_len[id] == len && memcmp(t->text + t->text_off[id], s, len) == 0) return id;
    }
}

static inline uint32_t pair_slot(uint64_t key, uint32_t mask)
{
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

int32_t tok_merge_rank(const spark_tokenizer *t, int32_t left, int32_t right)
{
    uint64_t key = tok_pair_key(left, right);
    for (uint32_t i = pair_slot(key, t->merges.mask);; i = (i + 1) & t->merges.mask) {
        if (t->merges.key[i] == key) return t->merges.rank[i];
        if (t->merges.key[i] == UINT64_MAX) return -1;
    }
}

/* ---- builder -------------------------------------------------------------------- */

spark_status tok_builder_init(tok_builder *b, const char *source, int32_t n_vocab_hint)
{
    memset(b, 0, sizeof *b);
    spark_tokenizer *t = spark_calloc(1, sizeof *t, "tokenizer");
    if (!t) return SPARK_ERR_NOMEM;
    b->tok = t;
    t->unk_id = t->bos_id = t->eos_id = t->pad_id = -1;
    pthread_mutex_init(&t->scratch_lock, NULL);
    t->source = spark_strdup(source);
    if (!t->source) return SPARK_ERR_NOMEM;
    (void)n_vocab_hint;
    return SPARK_OK;
}

static spark_status grow_ids(tok_builder *b, int32_t id)
{
    spark_tokenizer *t = b->tok;
    if (id < b->cap_ids) return SPARK_OK;
    int32_t cap = b->cap_ids ? b->cap_ids : 1024;
    while (cap <= id) cap *= 2;
    uint32_t *off = realloc(t->text_off, (size_t)cap * sizeof *off);
    if (off) t->text_off = off;
    uint32_t *len = realloc(t->text_len, (size_t)cap * sizeof *len);
    if (len) t->text_len = len;
    uint8_t *fl = realloc(t->flags, (size_t)cap);
    if (fl) t->flags = fl;
    if (!off || !len || !fl) return spark_fail(SPARK_ERR_NOMEM, "out of memory for %d token ids", cap);
    memset(t->flags + b->cap_ids, 0, (size_t)(cap - b->cap_ids));
    memset(t->text_len + b->cap_ids, 0, (size_t)(cap - b->cap_ids) * sizeof *len);
    memset(t->text_off + b->cap_ids, 0, (size_t)(cap - b->cap_ids) * sizeof *off);
    b->cap_ids = cap;
    return SPARK_OK;
}

static spark_status text_append(spark_tokenizer *t, const char *s, size_t len, uint32_t *off)
{
    if (t->text_size + len + 1 > UINT32_MAX)
        return spark_fail(SPARK_ERR_FORMAT, "%s: vocabulary text exceeds 4 GiB", t->source);
    if (t->text_size + len + 1 > t->text_cap) {
        size_t cap = t->text_cap ? t->text_cap : 1 << 16;
        while (cap < t->text_size + len + 1) cap *= 2;
        char *p = realloc(t->text, cap);
        if (!p) return spark_fail(SPARK_ERR_NOMEM, "out of memory for vocabulary text");
        t->text = p, t->text_cap = cap;
    }
    memcpy(t->text + t->text_size, s, len);
    t->text[t->text_size + len] = '\0';
    *off = (uint32_t)t->text_size;
    t->text_size += len + 1;
    return SPARK_OK;
}

spark_status tok_builder_set_token(tok_builder *b, int32_t id, const char *s, size_t len)
{
    spark_tokenizer *t = b->tok;
    if (id < 0 || id >= (1 << 24))
        return spark_fail(SPARK_ERR_FORMAT, "%s: token id %d out of range", t->source, id);
    TRY(grow_ids(b, id));
    if (t->flags[id] & TOKF_PRESENT) {
        /* A repeat with the same text is harmless (HF lists added tokens in
         * both model.vocab and added_tokens); a different text is not. */
        if (t->text_len[id] == len && memcmp(t->text + t->text_off[id], s, len) == 0) return SPARK_OK;
        return spark_fail(SPARK_ERR_FORMAT, "%s: id %d given to two different tokens", t->source, id);
    }
    TRY(text_append(t, s, len, &t->text_off[id]));
    t->text_len[id] = (uint32_t)len;
    t->flags[id] |= TOKF_PRESENT;
    if (id >= t->n_vocab) t->n_vocab = id + 1;
    return SPARK_OK;
}

spark_status tok_builder_set_added(tok_builder *b, int32_t id, bool special)
{
    spark_tokenizer *t = b->tok;
    if (id < 0 || id >= t->n_vocab || !(t->flags[id] & TOKF_PRESENT))
        return spark_fail(SPARK_ERR_FORMAT, "%s: added token id %d has no text", t->source, id);
    if (t->text_len[id] == 0)
        return spark_fail(SPARK_ERR_FORMAT, "%s: added token id %d is empty", t->source, id);
    t->flags[id] |= TOKF_ADDED | (special ? TOKF_SPECIAL : 0);
    return SPARK_OK;
}

spark_status tok_builder_index_vocab(tok_builder *b)
{
    spark_tokenizer *t = b->tok;
    uint32_t slots = pow2_at_least((uint64_t)t->n_vocab * 2);
    t->vocab.hash = spark_calloc(slots, sizeof(uint32_t), "vocabulary map");
    t->vocab.id = spark_calloc(slots, sizeof(int32_t), "vocabulary map");
    if (!t->vocab.hash || !t->vocab.id) return SPARK_ERR_NOMEM;
    t->vocab.mask = slots - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->flags[id] & TOKF_PRESENT)) continue;
        const char *s = t->text + t->text_off[id];
        uint32_t h = tok_hash_bytes(s, t->text_len[id]);
        uint32_t i = h & t->vocab.mask;
        /* On duplicate strings the lowest id wins (first one inserted). */
        if (tok_lookup(t, s, t->text_len[id]) >= 0) continue;
        while (t->vocab.hash[i]) i = (i + 1) & t->vocab.mask;
        t->vocab.hash[i] = h;
        t->vocab.id[i] = id;
    }
    return SPARK_OK;
}

spark_status tok_builder_add_merge(tok_builder *b, const char *left, size_t left_len,
                                   const char *right, size_t right_len)
{
    spark_tokenizer *t = b->tok;
    int32_t l = tok_lookup(t, left, left_len), r = tok_lookup(t, right, right_len);
    char stackbuf[512];
    char *cat = left_len + right_len <= sizeof stackbuf ? stackbuf : malloc(left_len + right_len);
    if (!cat) return spark_fail(SPARK_ERR_NOMEM, "out of memory joining a merge");
    memcpy(cat, left, left_len);
    memcpy(cat + left_len, right, right_len);
    int32_t m = tok_lookup(t, cat, left_len + right_len);
    if (cat != stackbuf) free(cat);
    if (l < 0 || r < 0 || m < 0) {
        /* Can never fire (a part is no token); HF refuses such a file, we skip it. */
        t->n_dead_merges++;
        return SPARK_OK;
    }
    if (t->n_merges == t->merge_cap) {
        int32_t cap = t->merge_cap ? t->merge_cap * 2 : 4096;
        int32_t *nl = realloc(t->merge_left, (size_t)cap * sizeof *nl);
        if (nl) t->merge_left = nl;
        int32_t *nr = realloc(t->merge_right, (size_t)cap * sizeof *nr);
        if (nr) t->merge_right = nr;
        int32_t *nn = realloc(t->merge_new, (size_t)cap * sizeof *nn);
        if (nn) t->merge_new = nn;
        if (!nl || !nr || !nn) return spark_fail(SPARK_ERR_NOMEM, "out of memory for merges");
        t->merge_cap = cap;
    }
    t->merge_left[t->n_merges] = l;
    t->merge_right[t->n_merges] = r;
    t->merge_new[t->n_merges] = m;
    t->n_merges++;
    return SPARK_OK;
}

static spark_status build_merge_map(spark_tokenizer *t)
{
    uint32_t slots = pow2_at_least((uint64_t)t->n_merges * 2);
    t->merges.key = malloc((size_t)slots * sizeof(uint64_t));
    t->merges.rank = malloc((size_t)slots * sizeof(int32_t));
    if (!t->merges.key || !t->merges.rank) return spark_fail(SPARK_ERR_NOMEM, "out of memory for merge map");
    memset(t->merges.key, 0xFF, (size_t)slots * sizeof(uint64_t));
    t->merges.mask = slots - 1;
    for (int32_t r = 0; r < t->n_merges; r++) {
        uint64_t key = tok_pair_key(t->merge_left[r], t->merge_right[r]);
        uint32_t i = pair_slot(key, t->merges.mask);
        while (t->merges.key[i] != UINT64_MAX && t->merges.key[i] != key) i = (i + 1) & t->merges.mask;
        /* A repeated pair keeps its last rank, as HF's map insertion does. */
        t->merges.key[i] = key;
        t->merges.rank[i] = r;
    }
    return SPARK_OK;
}

/* The bytes a token decodes to: each character mapped back through the
 * byte-level alphabet, or, when some character is not part of it (added
 * tokens such as "<｜end▁of▁sentence｜>"), the token's UTF-8 as is. This is
 * the rule of HF's ByteLevel decoder. Returns the length written to out. */
static size_t token_bytes(const uint8_t *s, size_t len, uint8_t *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_seq_len(s + i, len - i);
        uint32_t cp;
        if (n == 1) cp = s[i];
        else if (n == 2) cp = ((s[i] & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
        else goto raw; /* byte-level code points are all < 0x800 */
        int b = tok_cp_to_byte(cp);
        if (b < 0) goto raw;
        out[o++] = (uint8_t)b;
        i += n;
    }
    return o;
raw:
    memcpy(out, s, len);
    return len;
}

static spark_status build_decode_table(spark_tokenizer *t)
{
    t->piece_off = spark_calloc((size_t)t->n_vocab + 1, sizeof(uint32_t), "decode table");
    t->piece = malloc(t->text_size + 1); /* a piece is never longer than its text */
    if (!t->piece_off || !t->piece) return spark_fail(SPARK_ERR_NOMEM, "out of memory for decode table");
    uint32_t o = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = o;
        if (t->flags[id] & TOKF_PRESENT)
            o += (uint32_t)token_bytes((const uint8_t *)t->text + t->text_off[id], t->text_len[id],
                                       t->piece + o);
    }
    t->piece_off[t->n_vocab] = o;
    return SPARK_OK;
}

static void build_byte_ids(spark_tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        uint32_t cp = tok_byte_to_cp((uint8_t)b);
        char s[2];
        size_t n = 1;
        if (cp < 0x80) s[0] = (char)cp;
        else s[0] = (char)(0xC0 | (cp >> 6)), s[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
        t->byte_id[b] = tok_lookup(t, s, n);
    }
}

static int added_cmp(const void *pa, const void *pb)
{
    const tok_added *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1; /* longest first */
    return a->id < b->id ? -1 : a->id > b->id;
}

static spark_status build_added_table(spark_tokenizer *t)
{
    int32_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) n += (t->flags[id] & TOKF_ADDED) != 0;
    if (n > 65535) return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: %d added tokens (max 65535)", t->source, n);
    t->added = spark_calloc((size_t)n, sizeof *t->added, "added tokens");
    if (!t->added) return SPARK_ERR_NOMEM;
    t->added_text = t->text; /* contents are the token strings themselves */
    t->n_added = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->flags[id] & TOKF_ADDED)) continue;
        tok_added *a = &t->added[t->n_added++];
        a->id = id, a->off = t->text_off[id], a->len = t->text_len[id];
        a->first = (uint8_t)t->text[a->off];
        a->special = (t->flags[id] & TOKF_SPECIAL) != 0;
    }
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, added_cmp);
    int32_t k = 0;
    for (int b = 0; b < 256; b++) {
        t->added_first[b] = (uint16_t)k;
        while (k < t->n_added && t->added[k].first == b) k++;
    }
    t->added_first[256] = (uint16_t)k;
    return SPARK_OK;
}

spark_status tok_builder_finish(tok_builder *b, spark_tokenizer **out)
{
    spark_tokenizer *t = b->tok;
    if (t->n_vocab == 0) return spark_fail(SPARK_ERR_FORMAT, "%s: empty vocabulary", t->source);
    if (!t->vocab.hash) TRY(tok_builder_index_vocab(b));
    TRY(build_merge_map(t));
    TRY(build_decode_table(t));
    TRY(build_added_table(t));
    build_byte_ids(t);
    *out = t;
    b->tok = NULL;
    return SPARK_OK;
}

void tok_builder_abort(tok_builder *b)
{
    if (b->tok) spark_tokenizer_free(b->tok);
    b->tok = NULL;
}

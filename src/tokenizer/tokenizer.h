/*
 * tokenizer.h — internals of the byte-level BPE tokenizer (SPEC §5).
 *
 * Data flow of an encode:  raw text
 *   -> utf8 repair (invalid sequences become U+FFFD, see utf8.c)
 *   -> added-token split (longest match in raw text, encode.c)
 *   -> pre-tokenizer: a sequence of "isolate every regex match" steps (pretokenize.c)
 *   -> byte-level BPE merge loop per piece, with a piece cache (bpe.c)
 *
 * Everything here is built once by the loaders (vocab_load.c: tokenizer.json or
 * GGUF metadata, both through the same builder in vocab.c) and is read-only
 * afterwards, except the scratch area, which one encode call at a time borrows
 * under a mutex (see encode.c).
 */
#ifndef SPARK_TOKENIZER_INTERNAL_H
#define SPARK_TOKENIZER_INTERNAL_H

#include "spark.h"

#include "base/error.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- hash maps (vocab.c) ---------------------------------------------- */

/* token string -> id; keys live in the tokenizer's text arena. */
typedef struct str_map {
    uint32_t *hash;  /* per slot; 0 = empty (real hashes are forced non-zero) */
    int32_t *id;     /* per slot */
    uint32_t mask;   /* slots - 1 */
} str_map;

/* (left id, right id) -> merge rank. */
typedef struct pair_map {
    uint64_t *key;   /* per slot; UINT64_MAX = empty */
    int32_t *rank;
    uint32_t mask;
} pair_map;

uint32_t tok_hash_bytes(const void *data, size_t len);

static inline uint64_t tok_pair_key(int32_t a, int32_t b)
{
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

/* ---- pre-tokenizer (pretokenize.c) ------------------------------------ */

enum { PRETOK_MAX_STEPS = 8 };

typedef struct pretok {
    pcre2_code *step[PRETOK_MAX_STEPS]; /* each: split, keeping matches and gaps */
    bool jit[PRETOK_MAX_STEPS];         /* JIT compilation succeeded */
    int n_steps;
} pretok;

/* Per-thread matching state (PCRE2 match data must not be shared). */
typedef struct pretok_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
} pretok_scratch;

/* Called once per final piece, in text order; non-zero return aborts the split. */
typedef int (*pretok_piece_fn)(void *ctx, const char *s, size_t len);

/* Compile one Split step from a regex (UTF + UCP, JIT). `what` names the source
 * for errors. */
spark_status pretok_add_regex(pretok *p, const char *pattern, size_t len, const char *what);
/* The SPEC §5 pipeline (used for GGUF files whose pre-tokenizer is "spark2_5"). */
spark_status pretok_init_spark(pretok *p);
void pretok_free(pretok *p);

spark_status pretok_scratch_init(pretok_scratch *s);
void pretok_scratch_free(pretok_scratch *s);

/* Split valid UTF-8 `s` into pieces; returns SPARK_OK, or the status the
 * callback asked for (it reports through spark_fail), or a regex error. */
spark_status pretok_split(const pretok *p, pretok_scratch *scr, const char *s, size_t len,
                          pretok_piece_fn fn, void *ctx);

/* ---- BPE (bpe.c) ------------------------------------------------------- */

typedef struct bpe_symbol {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int32_t alive;      /* 0 once merged into its left neighbour */
} bpe_symbol;

/* Repeated pieces (words, whitespace runs) are encoded once. Open addressing;
 * when full the whole cache is dropped (cheap, and keeps memory bounded). */
typedef struct bpe_cache {
    uint32_t *hash;       /* per slot, 0 = empty */
    uint32_t *key_off;    /* into keys */
    uint32_t *key_len;
    uint32_t *ids_off;    /* into ids */
    uint32_t *n_ids;
    uint32_t mask, used;
    char *keys;
    size_t keys_len, keys_cap;
    int32_t *ids;
    size_t ids_len, ids_cap;
} bpe_cache;

typedef struct bpe_scratch {
    bpe_symbol *sym;
    size_t sym_cap;
    uint64_t *heap; /* (rank << 32) | position: pops lowest rank, then leftmost */
    size_t heap_len, heap_cap;
    bpe_cache cache;
    bool use_cache;
} bpe_scratch;

/* ---- the tokenizer ----------------------------------------------------- */

typedef struct tok_added {
    int32_t id;
    uint32_t off, len; /* content bytes in added_text */
    uint8_t first;     /* first content byte (the sort key) */
    bool special;      /* "special": true in HF terms (skipped by SKIP_SPECIAL) */
} tok_added;

/* Everything one encode call mutates. */
typedef struct tok_scratch {
    pretok_scratch pre;
    bpe_scratch bpe;
    char *clean;       /* repaired copy of invalid UTF-8 input */
    size_t clean_cap;
} tok_scratch;

struct spark_tokenizer {
    int32_t n_vocab;       /* max id + 1 */
    /* id -> token string as stored (byte-level alphabet), NUL-terminated in text */
    uint32_t *text_off;    /* n_vocab entries */
    uint32_t *text_len;    /* n_vocab entries (without the NUL) */
    char *text;
    size_t text_size, text_cap;
    /* id -> the bytes it decodes to */
    uint32_t *piece_off;   /* n_vocab + 1 offsets into piece */
    uint8_t *piece;
    uint8_t *flags;        /* TOKF_* per id */
    str_map vocab;
    int32_t byte_id[256];  /* id of the single-byte token, -1 when absent */
    pair_map merges;
    int32_t *merge_left, *merge_right; /* rank -> the pair's ids */
    int32_t *merge_new;    /* rank -> id of the merged token */
    int32_t n_merges, merge_cap;
    int32_t n_dead_merges; /* merges skipped because a part or the result is no token */
    tok_added *added;      /* sorted by first byte, then longest first */
    int32_t n_added;
    char *added_text;
    uint16_t added_first[257]; /* added[added_first[b] .. added_first[b+1]) start with byte b */
    int32_t unk_id, bos_id, eos_id, pad_id;
    bool add_bos;
    pretok pre;
    char *source;          /* the path it was loaded from, for messages */
    pthread_mutex_t scratch_lock;
    tok_scratch scratch;   /* borrowed under scratch_lock (encode.c) */
};

enum {
    TOKF_PRESENT = 1, /* the id has a token */
    TOKF_ADDED = 2,   /* matched in raw text (HF added token / GGUF control or user-defined) */
    TOKF_SPECIAL = 4, /* special: skipped when decoding with SPARK_DECODE_SKIP_SPECIAL */
};

/* ---- building (vocab.c), used by both loaders --------------------------- */

/* A loader collects tokens, merges and added tokens here, then calls
 * tok_build_finish, which builds the maps and decode tables. */
typedef struct tok_builder {
    spark_tokenizer *tok; /* being built; arrays sized cap_ids */
    int32_t cap_ids;
} tok_builder;

spark_status tok_builder_init(tok_builder *b, const char *source, int32_t n_vocab_hint);
/* Set the vocabulary string of `id` (bytes need not be NUL-free). */
spark_status tok_builder_set_token(tok_builder *b, int32_t id, const char *s, size_t len);
/* Declare `id` an added token; its content is the token string already set. */
spark_status tok_builder_set_added(tok_builder *b, int32_t id, bool special);
/* Builds the vocab map; must precede tok_builder_add_merge. */
spark_status tok_builder_index_vocab(tok_builder *b);
/* Append merge `left right` (rank = order of calls); a merge whose parts or
 * result are not tokens is counted as dead and skipped. */
spark_status tok_builder_add_merge(tok_builder *b, const char *left, size_t left_len,
                                   const char *right, size_t right_len);
spark_status tok_builder_finish(tok_builder *b, spark_tokenizer **out);
void tok_builder_abort(tok_builder *b);

int32_t tok_lookup(const spark_tokenizer *t, const char *s, size_t len);
int32_t tok_merge_rank(const spark_tokenizer *t, int32_t left, int32_t right);

/* ---- bpe.c ---------------------------------------------------------------- */

spark_status bpe_scratch_init(bpe_scratch *s, bool use_cache);
void bpe_scratch_free(bpe_scratch *s);
/* Append the ids of one pre-tokenized piece (raw bytes) to out. */
spark_status bpe_encode_piece(const spark_tokenizer *t, bpe_scratch *s, const uint8_t *bytes,
                              size_t len, spark_token_buf *out);

/* GPT-2's byte-level alphabet: the code point standing for byte b, and back
 * (-1 for code points that stand for no byte). */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);

/* ---- utf8.c --------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..len), or 0 when s[0] starts an
 * invalid or truncated sequence. */
size_t utf8_seq_len(const uint8_t *s, size_t len);
/* Length of the maximal invalid subpart at s (>= 1): the bytes that one
 * U+FFFD replaces, per Unicode's "maximal subpart" practice (as Python's
 * errors="replace" and Rust's from_utf8_lossy do). */
size_t utf8_invalid_len(const uint8_t *s, size_t len);
/* For a non-ASCII lead byte s[0]: how many bytes from s form a valid prefix
 * of one sequence (0 when s[0] is no valid lead), and the full length that
 * sequence needs in *need (0 for an invalid lead). */
size_t utf8_valid_prefix(const uint8_t *s, size_t len, size_t *need);
/* True when all of s is valid UTF-8. */
bool utf8_valid(const uint8_t *s, size_t len);
/* Bytes s would need after repair (each maximal invalid subpart -> 3 bytes). */
size_t utf8_repaired_len(const uint8_t *s, size_t len);
/* Write the repaired text to out (utf8_repaired_len bytes); returns that length. */
size_t utf8_repair(const uint8_t *s, size_t len, char *out);

/* ---- spark_token_buf helpers (encode.c) ------------------------------------ */
spark_status tok_buf_reserve(spark_token_buf *b, size_t extra);

#endif

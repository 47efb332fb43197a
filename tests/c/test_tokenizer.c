/*
 * test_tokenizer.c — unit tests of the BPE tokenizer on small tokenizers
 * built here (merge order, HF's tie rule, dead merges, added tokens,
 * invalid UTF-8, decoding, the streaming detokenizer, threads) and the
 * real Spark-X2.5 vocabulary when ../shared provides it.
 */
#include "check.h"

#include "spark.h"
#include "tokenizer/tokenizer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REAL_DIR "../shared/tokenizers/spark-x2.5"

static char tmp_json[256];

/* The byte-level symbol of byte b as UTF-8 (NUL-terminated). */
static void sym(uint8_t b, char out[3])
{
    uint32_t cp = tok_byte_to_cp(b);
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), out[2] = 0;
}

/* JSON-escape a short ASCII-or-UTF-8 string into out. */
static void esc(const char *s, char *out)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') *out++ = '\\';
        *out++ = *s;
    }
    *out = 0;
}

/* A tokenizer.json: all 256 byte symbols (ids 10..265), extra tokens from
 * 266 on, the given merges, added tokens <x> (id 0, special) and <xy> (id 1),
 * and the SPEC §5 pre-tokenizer. */
static const char *write_small(const char *const *extra, int n_extra, const char *const *merges, int n_merges)
{
    snprintf(tmp_json, sizeof tmp_json, "/tmp/spark_tok_test_%d.json", (int)getpid());
    FILE *f = fopen(tmp_json, "w");
    fputs("{\"added_tokens\":[{\"id\":0,\"content\":\"<x>\",\"special\":true},"
          "{\"id\":1,\"content\":\"<xy>\",\"special\":false}],\"normalizer\":null,"
          "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
          "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}{1,3}\"},\"behavior\":\"Isolated\",\"invert\":false},"
          "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+|[^\\\\s]+\"},\"behavior\":\"Isolated\",\"invert\":false},"
          "{\"type\":\"Digits\",\"individual_digits\":true},"
          "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
          "\"model\":{\"type\":\"BPE\",\"unk_token\":null,\"vocab\":{\"<x>\":0,\"<xy>\":1", f);
    char s[8], e[64];
    for (int b = 0; b < 256; b++) {
        sym((uint8_t)b, s);
        esc(s, e);
        fprintf(f, ",\"%s\":%d", e, 10 + b);
    }
    for (int i = 0; i < n_extra; i++) fprintf(f, ",\"%s\":%d", extra[i], 266 + i);
    fputs("},\"merges\":[", f);
    for (int i = 0; i < n_merges; i++) fprintf(f, "%s\"%s\"", i ? "," : "", merges[i]);
    fputs("]}}", f);
    fclose(f);
    return tmp_json;
}

static spark_tokenizer *small(void)
{
    static const char *const extra[] = {"ab", "bc", "abc", "aa", "ĠĠ", "ĠĠĠĠ"};
    static const char *const merges[] = {"a b", "b c", "ab c", "a a", "x zz", "Ġ Ġ", "ĠĠ ĠĠ"};
    spark_tokenizer *t = NULL;
    spark_status st = spark_tokenizer_load(write_small(extra, 6, merges, 7), &t);
    CHECK_MSG(st == SPARK_OK, "%s", spark_last_error());
    return t;
}

static int encode_eq(spark_tokenizer *t, const char *text, uint32_t flags, const int32_t *want, size_t n)
{
    spark_token_buf b = {0};
    spark_status st = spark_tokenizer_encode(t, text, strlen(text), flags, &b);
    int ok = st == SPARK_OK && b.n == n && (n == 0 || memcmp(b.ids, want, n * sizeof *want) == 0);
    if (!ok) {
        printf("  encode(\"%s\") =", text);
        for (size_t i = 0; i < b.n; i++) printf(" %d", b.ids[i]);
        printf("\n");
    }
    spark_token_buf_free(&b);
    return ok;
}

#define ID(c) (10 + (c)) /* id of an ASCII printable byte's symbol */

static void test_merge_order_and_ties(void)
{
    spark_tokenizer *t = small();
    if (!t) return;
    CHECK(encode_eq(t, "abc", 0, (int32_t[]){268}, 1));          /* a+b, then ab+c */
    CHECK(encode_eq(t, "bca", 0, (int32_t[]){267, ID('a')}, 2)); /* b+c */
    CHECK(encode_eq(t, "aaa", 0, (int32_t[]){269, ID('a')}, 2)); /* leftmost pair first */
    CHECK(encode_eq(t, "aaaa", 0, (int32_t[]){269, 269}, 2));
    CHECK(encode_eq(t, "", 0, NULL, 0));
    /* Whitespace run of 5: "ĠĠĠĠ" + "Ġ" (HF's order: rank then position). */
    CHECK(encode_eq(t, "     ", 0, (int32_t[]){271, 10 + ' '}, 2));
    CHECK(spark_tokenizer_n_dead_merges(t) == 1); /* "x zz": zz is no token */
    CHECK(spark_tokenizer_n_vocab(t) == 272);
    spark_tokenizer_free(t);
}

static void test_added_tokens(void)
{
    spark_tokenizer *t = small();
    if (!t) return;
    /* Longest match: "<xy>" wins over "<x>" at the same position. */
    CHECK(encode_eq(t, "<xy><x>", SPARK_ENCODE_PARSE_SPECIAL, (int32_t[]){1, 0}, 2));
    CHECK(encode_eq(t, "ab<x>c", SPARK_ENCODE_PARSE_SPECIAL, (int32_t[]){266, 0, ID('c')}, 3));
    CHECK(encode_eq(t, "<x", SPARK_ENCODE_PARSE_SPECIAL, (int32_t[]){ID('<'), ID('x')}, 2));
    /* Without the flag added-token text is plain. */
    CHECK(encode_eq(t, "<x>", 0, (int32_t[]){ID('<'), ID('x'), ID('>')}, 3));
    CHECK(spark_tokenizer_is_added(t, 1) && !spark_tokenizer_is_special(t, 1));
    CHECK(spark_tokenizer_is_special(t, 0));
    CHECK(!spark_tokenizer_is_added(t, 266));
    CHECK(spark_tokenizer_token_id(t, "<xy>", 4) == 1);
    CHECK(spark_tokenizer_token_id(t, "nope", 4) == -1);
    CHECK(!strcmp(spark_tokenizer_token_text(t, 270), "ĠĠ"));
    size_t len;
    const char *p = spark_tokenizer_token_piece(t, 270, &len);
    CHECK(len == 2 && !memcmp(p, "  ", 2));
    CHECK(spark_tokenizer_token_piece(t, 9999, &len) == NULL && len == 0);
    CHECK(spark_tokenizer_token_text(t, -1) == NULL);
    spark_tokenizer_free(t);
}

static void test_invalid_utf8_is_replaced(void)
{
    spark_tokenizer *t = small();
    if (!t) return;
    static const char *const bad[] = {"a\xff" "b", "\xe4\xb8", "\xed\xa0\x80", "\xf0\x9f\x98", "\xc0\xaf"};
    static const char *const fixed[] = {"a\xef\xbf\xbd" "b", "\xef\xbf\xbd", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd",
                                        "\xef\xbf\xbd", "\xef\xbf\xbd\xef\xbf\xbd"};
    for (int i = 0; i < 5; i++) {
        spark_token_buf a = {0}, b = {0};
        CHECK(spark_tokenizer_encode(t, bad[i], strlen(bad[i]), 0, &a) == SPARK_OK);
        CHECK(spark_tokenizer_encode(t, fixed[i], strlen(fixed[i]), 0, &b) == SPARK_OK);
        CHECK_MSG(a.n == b.n && !memcmp(a.ids, b.ids, a.n * sizeof *a.ids), "case %d", i);
        CHECK(utf8_repaired_len((const uint8_t *)bad[i], strlen(bad[i])) == strlen(fixed[i]));
        spark_token_buf_free(&a), spark_token_buf_free(&b);
    }
    /* NUL bytes are characters, not terminators. */
    spark_token_buf z = {0};
    CHECK(spark_tokenizer_encode(t, "a\0b", 3, 0, &z) == SPARK_OK && z.n == 3 && z.ids[1] == 10);
    spark_token_buf_free(&z);
    spark_tokenizer_free(t);
}

static void test_decode_and_stream(void)
{
    spark_tokenizer *t = small();
    if (!t) return;
    char *text;
    size_t len;
    int32_t ids[] = {0, 266, 270, 1};
    CHECK(spark_tokenizer_decode(t, ids, 4, 0, &text, &len) == SPARK_OK);
    CHECK(len == 11 && !memcmp(text, "<x>ab  <xy>", 11));
    free(text);
    CHECK(spark_tokenizer_decode(t, ids, 4, SPARK_DECODE_SKIP_SPECIAL, &text, &len) == SPARK_OK);
    CHECK(!strcmp(text, "ab  <xy>")); /* <x> is special, <xy> is not */
    free(text);
    int32_t bad_id = 5000;
    CHECK(spark_tokenizer_decode(t, &bad_id, 1, 0, &text, &len) == SPARK_ERR_ARG);
    CHECK_ERROR_MENTIONS("5000");
    /* "é" = C3 A9 as two byte tokens; then a cut sequence and a stray byte. */
    int32_t seq[] = {10 + 0xC3, 10 + 0xA9, 10 + 0xE4, 10 + 0xB8, ID('z'), 10 + 0x80, 10 + 0xF0};
    CHECK(spark_tokenizer_decode(t, seq, 7, 0, &text, &len) == SPARK_OK);
    const char *want = "é\xef\xbf\xbdz\xef\xbf\xbd\xef\xbf\xbd";
    CHECK(!strcmp(text, want));
    free(text);
    spark_detokenizer *d;
    CHECK(spark_detokenizer_create(t, 0, &d) == SPARK_OK);
    char all[64] = "";
    const char *out;
    for (int i = 0; i < 7; i++) {
        CHECK(spark_detokenizer_push(d, seq[i], &out, &len) == SPARK_OK);
        CHECK(utf8_valid((const uint8_t *)out, len));
        if (i == 0 || i == 2 || i == 3) CHECK(len == 0); /* held: an unfinished character */
        strncat(all, out, len);
    }
    CHECK(spark_detokenizer_flush(d, &out, &len) == SPARK_OK);
    strncat(all, out, len);
    CHECK_MSG(!strcmp(all, want), "stream gave \"%s\"", all);
    CHECK(spark_detokenizer_push(d, -3, &out, &len) == SPARK_ERR_ARG);
    spark_detokenizer_free(d);
    spark_tokenizer_free(t);
}

typedef struct thread_job {
    spark_tokenizer *t;
    int ok;
} thread_job;

static void *encode_many(void *arg)
{
    thread_job *j = arg;
    j->ok = 1;
    for (int i = 0; i < 2000; i++)
        j->ok &= encode_eq(j->t, "abc bca aaaa     ", 0,
                           (int32_t[]){268, 10 + ' ', 267, ID('a'), 10 + ' ', 269, 269, 271, 10 + ' '}, 9);
    return NULL;
}

static void test_threads_share_a_tokenizer(void)
{
    spark_tokenizer *t = small();
    if (!t) return;
    pthread_t th[4];
    thread_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].t = t;
        pthread_create(&th[i], NULL, encode_many, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok);
    }
    spark_tokenizer_free(t);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* Random bytes (biased to UTF-8 lead/continuation bytes, added-token text,
 * spaces and digits): encoding never fails, decoding gives back exactly the
 * repaired input, and random ids decode to valid UTF-8. */
static void test_fuzz_round_trip(void)
{
    spark_tokenizer *t = small();
    if (!t) return;
    static const char *const bits[] = {"<x>", "<xy>", "<x", " ", "  ", "\n", "7", "ab", "\xc3", "\xa9", "\xe4\xb8",
                                       "\xad", "\xf0\x9f", "\x98\x80", "\xff", "\x00", "\xe3\x81\x82"};
    char buf[256], fixed[1024];
    int bad = 0;
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 0, parts = rnd() % 12;
        for (size_t k = 0; k < parts; k++) {
            if (rnd() % 3 == 0) {
                buf[n++] = (char)(rnd() & 0xFF);
            } else {
                const char *b = bits[rnd() % (sizeof bits / sizeof bits[0])];
                size_t l = b[0] ? strlen(b) : 1; /* "\x00" is one NUL byte */
                memcpy(buf + n, b, l);
                n += l;
            }
        }
        size_t m = utf8_repair((const uint8_t *)buf, n, fixed);
        for (uint32_t flags = 0; flags < 2; flags++) {
            spark_token_buf ids = {0};
            char *text = NULL;
            size_t len = 0;
            if (spark_tokenizer_encode(t, buf, n, flags, &ids) != SPARK_OK ||
                spark_tokenizer_decode(t, ids.ids, ids.n, 0, &text, &len) != SPARK_OK || len != m ||
                memcmp(text, fixed, m) != 0) {
                if (!bad) {
                    printf("  fuzz case: flags %u, %zu bytes:", flags, n);
                    for (size_t k = 0; k < n; k++) printf(" %02x", (unsigned char)buf[k]);
                    printf("\n  decoded %zu bytes, want %zu\n", len, m);
                }
                bad++;
            }
            free(text);
            spark_token_buf_free(&ids);
        }
        int32_t rid[8];
        for (int k = 0; k < 8; k++) rid[k] = (int32_t)(rnd() % 264) + 8; /* ids 2..9 are holes */
        for (int k = 0; k < 8; k++) rid[k] = rid[k] < 10 ? rid[k] - 8 : rid[k];
        char *text;
        size_t len;
        if (spark_tokenizer_decode(t, rid, 8, 0, &text, &len) != SPARK_OK || !utf8_valid((const uint8_t *)text, len))
            bad++;
        else
            free(text);
    }
    CHECK_MSG(bad == 0, "%d fuzz cases failed", bad);
    spark_tokenizer_free(t);
}

static void test_load_errors(void)
{
    spark_tokenizer *t = (spark_tokenizer *)1;
    CHECK(spark_tokenizer_load("/nonexistent/tok.json", &t) == SPARK_ERR_IO && t == NULL);
    CHECK_ERROR_MENTIONS("/nonexistent/tok.json");
    FILE *f = fopen(tmp_json, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"normalizer\": {\"type\": \"NFC\"},"
          "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", f);
    fclose(f);
    CHECK(spark_tokenizer_load(tmp_json, &t) == SPARK_ERR_UNSUPPORTED);
    CHECK_ERROR_MENTIONS("normalizer");
    f = fopen(tmp_json, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -4}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", f);
    fclose(f);
    CHECK(spark_tokenizer_load(tmp_json, &t) == SPARK_ERR_FORMAT);
    f = fopen(tmp_json, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vo", f);
    fclose(f);
    CHECK(spark_tokenizer_load(tmp_json, &t) == SPARK_ERR_FORMAT);
    CHECK(spark_tokenizer_load("/tmp", &t) == SPARK_ERR_MISSING);
    CHECK_ERROR_MENTIONS("tokenizer.json");
}

static void test_real_spark_vocab(void)
{
    if (access(REAL_DIR "/tokenizer.json", R_OK) != 0) {
        printf("SKIP test_real_spark_vocab: %s not present\n", REAL_DIR);
        return;
    }
    spark_tokenizer *t = NULL;
    CHECK(spark_tokenizer_load(REAL_DIR, &t) == SPARK_OK);
    if (!t) return;
    CHECK(encode_eq(t, "The capital of France is", 0, (int32_t[]){1046, 11862, 314, 17349, 390}, 5));
    CHECK(encode_eq(t, " Paris", 0, (int32_t[]){19500}, 1));
    CHECK(spark_tokenizer_n_vocab(t) == 131072);
    CHECK(spark_tokenizer_n_dead_merges(t) == 1); /* merge 50,312 */
    spark_tokenizer_specials sp = spark_tokenizer_get_specials(t);
    CHECK(sp.bos_id == 0 && sp.eos_id == 1 && sp.pad_id == 2 && !sp.add_bos);
    CHECK(spark_tokenizer_token_id(t, "\xc4\x86", 2) == 130985); /* "Ć", byte 0x06 */
    CHECK(encode_eq(t, "\x06", 0, (int32_t[]){130985}, 1));
    CHECK(encode_eq(t, "<think>x</think>", SPARK_ENCODE_PARSE_SPECIAL, (int32_t[]){3, 101, 4}, 3));
    spark_tokenizer_free(t);
}

int main(void)
{
    RUN(test_merge_order_and_ties);
    RUN(test_added_tokens);
    RUN(test_invalid_utf8_is_replaced);
    RUN(test_decode_and_stream);
    RUN(test_threads_share_a_tokenizer);
    RUN(test_fuzz_round_trip);
    RUN(test_load_errors);
    RUN(test_real_spark_vocab);
    unlink(tmp_json);
    CHECK_EXIT();
}

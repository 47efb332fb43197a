/*
 * cmd_tokenize.c — `spark tokenize`, `spark detokenize`, `spark chat-template`:
 * the tokenizer and chat format from the command line.
 *
 * MODEL is anything spark_tokenizer_load accepts: an HF directory, a
 * tokenizer.json file or a .gguf file. Exit status: 0 success, 1 runtime
 * failure (message on stderr), 2 bad usage (one line naming the flag).
 */
#include "cli/commands.h"

#include "spark.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "spark %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (spark %s --help)\n", cmd);
    return 2;
}

static int runtime_error(const char *cmd, spark_status st)
{
    fprintf(stderr, "spark %s: %s: %s\n", cmd, spark_status_str(st), spark_last_error());
    return 1;
}

/* Read a whole file; NULL (and a message) on failure. */
static char *read_all(const char *cmd, const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "spark %s: %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (cap - n - 1 == 0) {
            char *p = realloc(buf, cap *= 2);
            if (!p) free(buf);
            buf = p;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "spark %s: %s: out of memory\n", cmd, path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static void print_ids(const spark_token_buf *ids, bool json, FILE *to)
{
    if (json) fputc('[', to);
    for (size_t i = 0; i < ids->n; i++) fprintf(to, i ? (json ? ",%d" : " %d") : "%d", ids->ids[i]);
    fputs(json ? "]\n" : "\n", to);
}

static int load_tok(const char *cmd, const char *model, spark_tokenizer **tok)
{
    spark_status st = spark_tokenizer_load(model, tok);
    return st == SPARK_OK ? 0 : runtime_error(cmd, st);
}

/* ---- spark tokenize --------------------------------------------------------------- */

static const char tokenize_help[] =
    "usage: spark tokenize MODEL (--text STR | --file LINES.jsonl) [--json] [--plain-specials] [--bos]\n"
    "  MODEL             HF directory, tokenizer.json or .gguf file\n"
    "  --text STR        text to encode (invalid UTF-8 becomes U+FFFD before encoding)\n"
    "  --file PATH       one JSON string per line; prints one JSON id array per line\n"
    "  --json            print ids as a JSON array instead of space-separated\n"
    "  --plain-specials  encode added-token text (<|User|>, <think>, ...) as plain text\n"
    "  --bos             prepend the BOS id\n";

/* --file mode: one JSON string per input line, one JSON array per output line. */
static int tokenize_lines(spark_tokenizer *tok, const char *path, uint32_t flags)
{
    size_t len;
    char *data = read_all("tokenize", path, &len);
    if (!data) return 1;
    spark_token_buf ids = {0};
    int rc = 0, line_no = 0;
    for (char *line = data, *end; line < data + len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(data + len - line));
        if (!end) end = data + len;
        line_no++;
        if (end == line) continue;
        cJSON *s = cJSON_ParseWithLength(line, (size_t)(end - line));
        if (!cJSON_IsString(s)) {
            fprintf(stderr, "spark tokenize: %s:%d: not a JSON string\n", path, line_no);
            cJSON_Delete(s);
            rc = 1;
            break;
        }
        ids.n = 0;
        spark_status st = spark_tokenizer_encode(tok, s->valuestring, strlen(s->valuestring), flags, &ids);
        cJSON_Delete(s);
        if (st != SPARK_OK) {
            rc = runtime_error("tokenize", st);
            break;
        }
        print_ids(&ids, true, stdout);
    }
    spark_token_buf_free(&ids);
    free(data);
    return rc;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL;
    bool json = false;
    uint32_t flags = SPARK_ENCODE_PARSE_SPECIAL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(tokenize_help, stdout);
            return 0;
        } else if (!strcmp(a, "--text") || !strcmp(a, "--file")) {
            if (i + 1 >= argc) return usage_error("tokenize", "%s needs a value", a);
            *(a[2] == 't' ? &text : &file) = argv[++i];
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--plain-specials")) {
            flags &= ~(uint32_t)SPARK_ENCODE_PARSE_SPECIAL;
        } else if (!strcmp(a, "--bos")) {
            flags |= SPARK_ENCODE_ADD_BOS;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("tokenize", "unknown option '%s'", a);
        } else if (!model) {
            model = a;
        } else {
            return usage_error("tokenize", "unexpected argument '%s'", a);
        }
    }
    if (!model) return usage_error("tokenize", "%s", "missing MODEL");
    if (!text == !file) return usage_error("tokenize", "%s", "give exactly one of --text or --file");
    spark_tokenizer *tok;
    if (load_tok("tokenize", model, &tok)) return 1;
    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    int rc = 0;
    if (file) {
        rc = tokenize_lines(tok, file, flags);
    } else {
        spark_token_buf ids = {0};
        spark_status st = spark_tokenizer_encode(tok, text, strlen(text), flags, &ids);
        if (st == SPARK_OK) print_ids(&ids, json, stdout);
        else rc = runtime_error("tokenize", st);
        spark_token_buf_free(&ids);
    }
    spark_tokenizer_free(tok);
    fflush(stdout);
    return rc;
}

/* ---- spark detokenize ------------------------------------------------------------- */

static const char detokenize_help[] =
    "usage: spark detokenize MODEL --ids 1,2,3 [--skip-special] [--json] [--stream]\n"
    "  --ids LIST      token ids, separated by commas or spaces\n"
    "  --skip-special  drop special tokens (BOS, EOS, pad, unused)\n"
    "  --json          print {\"text\": ...} (exact, with escapes)\n"
    "  --stream        print the streaming detokenizer's chunks, one JSON string per id\n";

/* Parse "1,2 3" into ids; false on anything that is not an int32. */
static bool parse_ids(const char *s, spark_token_buf *ids)
{
    while (*s) {
        while (*s == ',' || *s == ' ') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < INT32_MIN || v > INT32_MAX || (*end && *end != ',' && *end != ' '))
            return false;
        if (ids->n == ids->cap) {
            size_t cap = ids->cap ? ids->cap * 2 : 64;
            int32_t *p = realloc(ids->ids, cap * sizeof *p);
            if (!p) return false;
            ids->ids = p, ids->cap = cap;
        }
        ids->ids[ids->n++] = (int32_t)v;
        s = end;
    }
    return true;
}

/* JSON string of s[0..len) (valid UTF-8, may hold NUL bytes). */
static void print_json_string(const char *s, size_t len, FILE *to)
{
    fputc('"', to);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(to, "\\%c", c);
        else if (c == '\n') fputs("\\n", to);
        else if (c < 0x20 || c == 0x7F) fprintf(to, "\\u%04x", c);
        else fputc(c, to);
    }
    fputc('"', to);
}

static int detok_stream(spark_tokenizer *tok, const spark_token_buf *ids, uint32_t flags)
{
    spark_detokenizer *d;
    spark_status st = spark_detokenizer_create(tok, flags, &d);
    if (st != SPARK_OK) return runtime_error("detokenize", st);
    const char *text;
    size_t len;
    fputc('[', stdout);
    for (size_t i = 0; i <= ids->n && st == SPARK_OK; i++) {
        st = i < ids->n ? spark_detokenizer_push(d, ids->ids[i], &text, &len)
                        : spark_detokenizer_flush(d, &text, &len);
        if (st == SPARK_OK) {
            if (i) fputc(',', stdout);
            print_json_string(text, len, stdout);
        }
    }
    fputs("]\n", stdout);
    spark_detokenizer_free(d);
    return st == SPARK_OK ? 0 : runtime_error("detokenize", st);
}

int cmd_detokenize(int argc, char **argv)
{
    const char *model = NULL, *list = NULL;
    bool json = false, stream = false;
    uint32_t flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(detokenize_help, stdout);
            return 0;
        } else if (!strcmp(a, "--ids")) {
            if (i + 1 >= argc) return usage_error("detokenize", "%s needs a value", a);
            list = argv[++i];
        } else if (!strcmp(a, "--skip-special")) {
            flags |= SPARK_DECODE_SKIP_SPECIAL;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--stream")) {
            stream = true;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("detokenize", "unknown option '%s'", a);
        } else if (!model) {
            model = a;
        } else {
            return usage_error("detokenize", "unexpected argument '%s'", a);
        }
    }
    if (!model) return usage_error("detokenize", "%s", "missing MODEL");
    if (!list) return usage_error("detokenize", "%s", "missing --ids");
    spark_token_buf ids = {0};
    if (!parse_ids(list, &ids)) {
        spark_token_buf_free(&ids);
        return usage_error("detokenize", "bad --ids value '%s'", list);
    }
    spark_tokenizer *tok = NULL;
    int rc = load_tok("detokenize", model, &tok);
    if (rc == 0 && stream) {
        rc = detok_stream(tok, &ids, flags);
    } else if (rc == 0) {
        char *text;
        size_t len;
        spark_status st = spark_tokenizer_decode(tok, ids.ids, ids.n, flags, &text, &len);
        if (st != SPARK_OK) {
            rc = runtime_error("detokenize", st);
        } else if (json) {
            fputs("{\"text\":", stdout);
            print_json_string(text, len, stdout);
            fputs("}\n", stdout);
        } else {
            fwrite(text, 1, len, stdout);
        }
        if (st == SPARK_OK) free(text);
    }
    spark_tokenizer_free(tok);
    spark_token_buf_free(&ids);
    return rc;
}

int cmd_chat_template(int argc, char **argv) { return 2; }

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
#include <time.h>

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
    "usage: spark tokenize MODEL (--text STR | --file LINES.jsonl | --input FILE) [--json] [--plain-specials]\n"
    "                     [--bos] [--count] [--time]\n"
    "  MODEL             HF directory, tokenizer.json or .gguf file\n"
    "  --text STR        text to encode (invalid UTF-8 becomes U+FFFD before encoding)\n"
    "  --file PATH       one JSON string per line; prints one JSON id array per line\n"
    "  --input PATH      encode the file's bytes as one text\n"
    "  --json            print ids as a JSON array instead of space-separated\n"
    "  --count           print only the number of ids\n"
    "  --time            report encode time and MB/s on stderr (loading excluded)\n"
    "  --plain-specials  encode added-token text (<|User|>, <think>, ...) as plain text\n"
    "  --bos             prepend the BOS id\n";

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_u16(const char *p, const char *end, uint32_t *v)
{
    if (end - p < 4) return 0;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit(p[i]);
        if (d < 0) return 0;
        *v = *v * 16 + (uint32_t)d;
    }
    return 1;
}

static size_t put_utf8(uint32_t cp, char *out)
{
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 63)),
               out[2] = (char)(0x80 | (cp & 63)), 3;
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | ((cp >> 12) & 63));
    out[2] = (char)(0x80 | ((cp >> 6) & 63)), out[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* Decode the JSON string literal in [p, end) into out (at least end - p
 * bytes); NUL characters survive (cJSON would cut the string there). A lone
 * surrogate becomes U+FFFD. Returns the length, or -1 if it is no string. */
static long json_unescape(const char *p, const char *end, char *out)
{
    while (p < end && *p == ' ') p++;
    while (end > p && (end[-1] == ' ' || end[-1] == '\r')) end--;
    if (end - p < 2 || *p != '"' || end[-1] != '"') return -1;
    size_t o = 0;
    for (p++, end--; p < end; p++) {
        if (*p != '\\') {
            out[o++] = *p;
            continue;
        }
        if (++p == end) return -1;
        const char *simple = strchr("\"\\/bfnrt", *p);
        if (simple && *p) {
            out[o++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            continue;
        }
        uint32_t cp, lo;
        if (*p != 'u' || !read_u16(p + 1, end, &cp)) return -1;
        p += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && end - p > 6 && p[1] == '\\' && p[2] == 'u' &&
            read_u16(p + 3, end, &lo) && lo >= 0xDC00 && lo < 0xE000) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
        } else if (cp >= 0xD800 && cp < 0xE000) {
            cp = 0xFFFD;
        }
        o += put_utf8(cp, out + o);
    }
    return (long)o;
}

/* --file mode: one JSON string per input line, one JSON array per output line. */
static int tokenize_lines(spark_tokenizer *tok, const char *path, uint32_t flags)
{
    size_t len;
    char *data = read_all("tokenize", path, &len);
    char *text = data ? malloc(len + 1) : NULL;
    if (!text) {
        free(data);
        return 1;
    }
    spark_token_buf ids = {0};
    int rc = 0, line_no = 0;
    for (char *line = data, *end; line < data + len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(data + len - line));
        if (!end) end = data + len;
        line_no++;
        if (end == line) continue;
        long n = json_unescape(line, end, text);
        if (n < 0) {
            fprintf(stderr, "spark tokenize: %s:%d: not a JSON string\n", path, line_no);
            rc = 1;
            break;
        }
        ids.n = 0;
        spark_status st = spark_tokenizer_encode(tok, text, (size_t)n, flags, &ids);
        if (st != SPARK_OK) {
            rc = runtime_error("tokenize", st);
            break;
        }
        print_ids(&ids, true, stdout);
    }
    spark_token_buf_free(&ids);
    free(text);
    free(data);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --text / --input: one text, encoded whole. */
static int tokenize_one(spark_tokenizer *tok, const char *text, size_t len, uint32_t flags, bool json, bool count,
                        bool timed)
{
    spark_token_buf ids = {0};
    double t0 = now_s();
    spark_status st = spark_tokenizer_encode(tok, text, len, flags, &ids);
    double dt = now_s() - t0;
    if (st != SPARK_OK) return spark_token_buf_free(&ids), runtime_error("tokenize", st);
    if (timed)
        fprintf(stderr, "encoded %zu bytes into %zu ids in %.3f s: %.2f MB/s\n", len, ids.n, dt,
                dt > 0 ? (double)len / dt / 1e6 : 0.0);
    if (count) printf("%zu\n", ids.n);
    else print_ids(&ids, json, stdout);
    spark_token_buf_free(&ids);
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL, *input = NULL;
    bool json = false, count = false, timed = false;
    uint32_t flags = SPARK_ENCODE_PARSE_SPECIAL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(tokenize_help, stdout);
            return 0;
        } else if (!strcmp(a, "--text") || !strcmp(a, "--file") || !strcmp(a, "--input")) {
            if (i + 1 >= argc) return usage_error("tokenize", "%s needs a value", a);
            *(a[2] == 't' ? &text : a[2] == 'f' ? &file : &input) = argv[++i];
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--count")) {
            count = true;
        } else if (!strcmp(a, "--time")) {
            timed = true;
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
    if ((text != NULL) + (file != NULL) + (input != NULL) != 1)
        return usage_error("tokenize", "%s", "give exactly one of --text, --file or --input");
    size_t in_len = 0;
    char *in_data = input ? read_all("tokenize", input, &in_len) : NULL;
    if (input && !in_data) return 1;
    spark_tokenizer *tok = NULL;
    int rc = load_tok("tokenize", model, &tok);
    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    if (rc == 0 && file) rc = tokenize_lines(tok, file, flags);
    else if (rc == 0 && input) rc = tokenize_one(tok, in_data, in_len, flags, json, count, timed);
    else if (rc == 0) rc = tokenize_one(tok, text, strlen(text), flags, json, count, timed);
    spark_tokenizer_free(tok);
    free(in_data);
    fflush(stdout);
    return rc;
}

/* ---- spark detokenize ------------------------------------------------------------- */

static const char detokenize_help[] =
    "usage: spark detokenize MODEL (--ids 1,2,3 | --file IDS.jsonl) [--skip-special] [--json] [--stream]\n"
    "  --ids LIST      token ids, separated by commas or spaces\n"
    "  --file PATH     one JSON id array per line; one JSON result per line\n"
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

typedef enum detok_mode { DETOK_RAW, DETOK_JSON, DETOK_STREAM } detok_mode;

static int detok_one(spark_tokenizer *tok, const spark_token_buf *ids, uint32_t flags, detok_mode mode)
{
    if (mode == DETOK_STREAM) return detok_stream(tok, ids, flags);
    char *text;
    size_t len;
    spark_status st = spark_tokenizer_decode(tok, ids->ids, ids->n, flags, &text, &len);
    if (st != SPARK_OK) return runtime_error("detokenize", st);
    if (mode == DETOK_JSON) {
        fputs("{\"text\":", stdout);
        print_json_string(text, len, stdout);
        fputs("}\n", stdout);
    } else {
        fwrite(text, 1, len, stdout);
    }
    free(text);
    return 0;
}

/* --file mode: one JSON id array per line in, one JSON result per line out. */
static int detok_lines(spark_tokenizer *tok, const char *path, uint32_t flags, detok_mode mode)
{
    size_t len;
    char *data = read_all("detokenize", path, &len);
    if (!data) return 1;
    spark_token_buf ids = {0};
    int rc = 0, line_no = 0;
    for (char *line = data, *end; rc == 0 && line < data + len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(data + len - line));
        if (!end) end = data + len;
        *end = '\0';
        line_no++;
        char *open = strchr(line, '['), *close = strrchr(line, ']');
        if (end == line) continue;
        if (!open || !close || close < open) {
            fprintf(stderr, "spark detokenize: %s:%d: not a JSON array of ids\n", path, line_no);
            rc = 1;
            break;
        }
        *close = '\0';
        ids.n = 0;
        if (!parse_ids(open + 1, &ids)) {
            fprintf(stderr, "spark detokenize: %s:%d: not a JSON array of ids\n", path, line_no);
            rc = 1;
            break;
        }
        rc = detok_one(tok, &ids, flags, mode == DETOK_RAW ? DETOK_JSON : mode);
    }
    spark_token_buf_free(&ids);
    free(data);
    return rc;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *model = NULL, *list = NULL, *file = NULL;
    detok_mode mode = DETOK_RAW;
    uint32_t flags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(detokenize_help, stdout);
            return 0;
        } else if (!strcmp(a, "--ids") || !strcmp(a, "--file")) {
            if (i + 1 >= argc) return usage_error("detokenize", "%s needs a value", a);
            *(a[2] == 'i' ? &list : &file) = argv[++i];
        } else if (!strcmp(a, "--skip-special")) {
            flags |= SPARK_DECODE_SKIP_SPECIAL;
        } else if (!strcmp(a, "--json")) {
            if (mode == DETOK_RAW) mode = DETOK_JSON;
        } else if (!strcmp(a, "--stream")) {
            mode = DETOK_STREAM;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("detokenize", "unknown option '%s'", a);
        } else if (!model) {
            model = a;
        } else {
            return usage_error("detokenize", "unexpected argument '%s'", a);
        }
    }
    if (!model) return usage_error("detokenize", "%s", "missing MODEL");
    if (!list == !file) return usage_error("detokenize", "%s", "give exactly one of --ids or --file");
    spark_token_buf ids = {0};
    if (list && !parse_ids(list, &ids)) {
        spark_token_buf_free(&ids);
        return usage_error("detokenize", "bad --ids value '%s'", list);
    }
    spark_tokenizer *tok = NULL;
    int rc = load_tok("detokenize", model, &tok);
    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    if (rc == 0) rc = file ? detok_lines(tok, file, flags, mode) : detok_one(tok, &ids, flags, mode);
    fflush(stdout);
    spark_tokenizer_free(tok);
    spark_token_buf_free(&ids);
    return rc;
}

/* ---- spark chat-template ---------------------------------------------------------- */

static const char chat_help[] =
    "usage: spark chat-template MODEL --messages FILE.json [--tools FILE.json] [--no-think]\n"
    "                          [--no-generation-prompt] [--json]\n"
    "  --messages FILE  [{\"role\": ..., \"content\": ...}, ...] or {\"messages\": [...], \"tools\": [...]}\n"
    "  --tools FILE     a JSON array of tool definitions (overrides the messages file's)\n"
    "  --no-think       end the prompt with </think> (enable_thinking = false)\n"
    "  --no-generation-prompt  do not open an assistant turn at the end\n"
    "  --json           print {\"text\": ..., \"ids\": [...]}; otherwise the prompt, then a line \"ids: ...\"\n";

static int render_chat(spark_tokenizer *tok, const spark_chat *chat, bool json)
{
    char *text = NULL;
    size_t len = 0;
    spark_token_buf ids = {0};
    spark_status st = spark_chat_render(tok, chat, &text, &len, &ids);
    if (st != SPARK_OK) {
        spark_token_buf_free(&ids);
        return runtime_error("chat-template", st);
    }
    if (json) {
        fputs("{\"text\":", stdout);
        print_json_string(text, len, stdout);
        fputs(",\"ids\":", stdout);
        print_ids(&ids, true, stdout);
        fputs("}\n", stdout);
    } else {
        fwrite(text, 1, len, stdout);
        fputs("\nids: ", stdout);
        print_ids(&ids, false, stdout);
    }
    free(text);
    spark_token_buf_free(&ids);
    return 0;
}

int cmd_chat_template(int argc, char **argv)
{
    const char *model = NULL, *messages = NULL, *tools = NULL;
    bool json = false, think = true, gen = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(chat_help, stdout);
            return 0;
        } else if (!strcmp(a, "--messages") || !strcmp(a, "--tools")) {
            if (i + 1 >= argc) return usage_error("chat-template", "%s needs a value", a);
            *(a[2] == 'm' ? &messages : &tools) = argv[++i];
        } else if (!strcmp(a, "--no-think")) {
            think = false;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            gen = false;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("chat-template", "unknown option '%s'", a);
        } else if (!model) {
            model = a;
        } else {
            return usage_error("chat-template", "unexpected argument '%s'", a);
        }
    }
    if (!model) return usage_error("chat-template", "%s", "missing MODEL");
    if (!messages) return usage_error("chat-template", "%s", "missing --messages");
    size_t mlen, tlen = 0;
    char *mtext = read_all("chat-template", messages, &mlen), *ttext = NULL;
    if (!mtext) return 1;
    if (tools && !(ttext = read_all("chat-template", tools, &tlen))) return free(mtext), 1;
    spark_chat_doc *doc = NULL;
    spark_tokenizer *tok = NULL;
    int rc = 0;
    spark_status st = spark_chat_doc_parse(mtext, mlen, &doc);
    if (st != SPARK_OK) rc = runtime_error("chat-template", st);
    if (rc == 0) rc = load_tok("chat-template", model, &tok);
    if (rc == 0) {
        spark_chat chat = spark_chat_doc_view(doc);
        chat.enable_thinking = think;
        chat.add_generation_prompt = gen;
        if (ttext) chat.tools_json = ttext;
        rc = render_chat(tok, &chat, json);
    }
    spark_tokenizer_free(tok);
    spark_chat_doc_free(doc);
    free(mtext);
    free(ttext);
    return rc;
}

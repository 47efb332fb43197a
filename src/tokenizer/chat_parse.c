/*
 * chat_parse.c — split streamed model output into reasoning, answer text
 * and tool calls (the inverse of chat_format.c's assistant turn).
 *
 * States: REASONING (until </think>) -> CONTENT -> on <tool_call>: NAME ->
 * <arg_key> KEY </arg_key> <arg_value> VALUE </arg_value> ... </tool_call>
 * -> CONTENT. Input may be cut anywhere, so text that could be the start of
 * a tag the current state is waiting for is held back until the next feed
 * (or finish) decides it. A tool call is reported once complete; the raw
 * text of an unfinished or malformed one is returned as CONTENT so nothing
 * the model wrote is lost.
 *
 * Argument values: SPEC §6 writes strings raw and other values as JSON. A
 * value is kept as a string when the tool's schema declares that parameter
 * "type": "string", or when it is not valid JSON (or is a JSON string
 * literal); otherwise it is the JSON value it spells.
 */
#include "tokenizer/tokenizer.h"

#include "base/mem.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

typedef enum pstate { P_REASONING, P_CONTENT, P_NAME, P_KEY, P_BEFORE_VALUE, P_VALUE, P_AFTER_VALUE } pstate;

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

typedef struct owned_event {
    spark_chat_event ev;
    char *a, *b; /* owned strings behind ev */
} owned_event;

struct spark_chat_parser {
    pstate state;
    bool any_output;    /* something was emitted or consumed (a leading <think> is only honoured first) */
    sbuf in;            /* input not yet decided */
    sbuf raw;           /* the current tool call's text, from <tool_call> on */
    sbuf name, key, value;
    cJSON *args;        /* the current call's arguments */
    cJSON *tools;       /* schemas, or NULL */
    owned_event *ev;
    size_t n_ev, cap_ev, head; /* ev[0..head) were handed out */
};

static spark_status sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return spark_fail(SPARK_ERR_NOMEM, "out of memory in the chat parser");
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return SPARK_OK;
}

static void sb_drop_front(sbuf *b, size_t n)
{
    if (n == 0) return;
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    b->p[b->n] = '\0';
}

/* ---- events ----------------------------------------------------------------------- */

static spark_status push_event(spark_chat_parser *p, spark_chat_event_kind kind, const char *s, size_t n,
                               char *name, char *args)
{
    if (kind != SPARK_CHAT_EVENT_TOOL_CALL && n == 0) return SPARK_OK;
    if (p->n_ev == p->cap_ev) {
        size_t cap = p->cap_ev ? p->cap_ev * 2 : 16;
        owned_event *e = realloc(p->ev, cap * sizeof *e);
        if (!e) return free(name), free(args), spark_fail(SPARK_ERR_NOMEM, "out of memory in the chat parser");
        p->ev = e, p->cap_ev = cap;
    }
    owned_event *e = &p->ev[p->n_ev];
    memset(e, 0, sizeof *e);
    e->ev.kind = kind;
    if (kind == SPARK_CHAT_EVENT_TOOL_CALL) {
        e->a = name, e->b = args;
        e->ev.name = name, e->ev.arguments_json = args;
    } else {
        e->a = malloc(n + 1);
        if (!e->a) return spark_fail(SPARK_ERR_NOMEM, "out of memory in the chat parser");
        memcpy(e->a, s, n);
        e->a[n] = '\0';
        e->ev.text = e->a, e->ev.len = n;
    }
    p->n_ev++;
    p->any_output = true;
    return SPARK_OK;
}

/* Free the events already handed out (their pointers expire now). */
static void release_returned(spark_chat_parser *p)
{
    if (p->head == 0) return;
    for (size_t i = 0; i < p->head; i++) free(p->ev[i].a), free(p->ev[i].b);
    memmove(p->ev, p->ev + p->head, (p->n_ev - p->head) * sizeof *p->ev);
    p->n_ev -= p->head;
    p->head = 0;
}

/* ---- argument values -------------------------------------------------------------- */

static const cJSON *tool_schema(const spark_chat_parser *p, const char *name)
{
    for (const cJSON *t = p->tools ? p->tools->child : NULL; t; t = t->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!f) f = t;
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return f;
    }
    return NULL;
}

static bool declared_string(const spark_chat_parser *p, const char *tool, const char *key)
{
    const cJSON *f = tool_schema(p, tool);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, key), "type");
    return cJSON_IsString(type) && !strcmp(type->valuestring, "string");
}

static spark_status add_argument(spark_chat_parser *p)
{
    cJSON *v = NULL;
    if (!declared_string(p, p->name.p, p->key.p)) {
        const char *end;
        v = cJSON_ParseWithOpts(p->value.p, &end, 1);
        if (v && cJSON_IsString(v)) cJSON_Delete(v), v = NULL; /* a quoted string stays as written */
    }
    if (!v) v = cJSON_CreateString(p->value.p);
    if (!v) return spark_fail(SPARK_ERR_NOMEM, "out of memory in the chat parser");
    cJSON_AddItemToObject(p->args, p->key.p, v);
    return SPARK_OK;
}

/* ---- the state machine ----------------------------------------------------------- */

static const char T_THINK[] = "<think>", T_CALL[] = "<tool_call>", T_END_CALL[] = "</tool_call>";

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_tag(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t k = t - 1 < n ? t - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

static void trim(sbuf *b)
{
    size_t s = 0;
    while (s < b->n && strchr(" \t\r\n", b->p[s])) s++;
    sb_drop_front(b, s);
    while (b->n && strchr(" \t\r\n", b->p[b->n - 1])) b->p[--b->n] = '\0';
}

static void reset_call(spark_chat_parser *p)
{
    p->raw.n = p->name.n = p->key.n = p->value.n = 0;
    cJSON_Delete(p->args);
    p->args = NULL;
}

static spark_status begin_call(spark_chat_parser *p)
{
    reset_call(p);
    p->args = cJSON_CreateObject();
    if (!p->args) return spark_fail(SPARK_ERR_NOMEM, "out of memory in the chat parser");
    p->state = P_NAME;
    return sb_put(&p->raw, T_CALL, strlen(T_CALL));
}

static spark_status end_call(spark_chat_parser *p)
{
    trim(&p->name);
    char *name = malloc(p->name.n + 1), *args = cJSON_PrintUnformatted(p->args);
    if (!name || !args) return free(name), free(args), spark_fail(SPARK_ERR_NOMEM, "out of memory in the chat parser");
    memcpy(name, p->name.p ? p->name.p : "", p->name.n + 1);
    reset_call(p);
    p->state = P_CONTENT;
    return push_event(p, SPARK_CHAT_EVENT_TOOL_CALL, NULL, 0, name, args);
}

/* A malformed call: give its text back as content and carry on. */
static spark_status abandon_call(spark_chat_parser *p)
{
    spark_status st = push_event(p, SPARK_CHAT_EVENT_CONTENT, p->raw.p, p->raw.n, NULL, NULL);
    reset_call(p);
    p->state = P_CONTENT;
    return st;
}

/* Find the first of up to two tags in in[0..n); returns the offset and which. */
static size_t find_tag(const char *s, size_t n, const char *a, const char *b, const char **which)
{
    if (n == 0) return *which = NULL, 0; /* also: s may be NULL before any input */
    const char *pa = a ? memmem(s, n, a, strlen(a)) : NULL, *pb = b ? memmem(s, n, b, strlen(b)) : NULL;
    if (pa && (!pb || pa <= pb)) return *which = a, (size_t)(pa - s);
    if (pb) return *which = b, (size_t)(pb - s);
    return *which = NULL, n;
}

/* Consume n bytes of input, recording them in the raw call text when inside one. */
static spark_status consume(spark_chat_parser *p, size_t n)
{
    if (p->state >= P_NAME) TRY(sb_put(&p->raw, p->in.p, n));
    sb_drop_front(&p->in, n);
    return SPARK_OK;
}

/* One step; *progress is false when the state needs more input. */
static spark_status step(spark_chat_parser *p, bool final, bool *progress)
{
    static const char *const want[][2] = {
        [P_REASONING] = {"</think>", NULL}, [P_CONTENT] = {"<tool_call>", NULL},
        [P_NAME] = {"<arg_key>", "</tool_call>"}, [P_KEY] = {"</arg_key>", NULL},
        [P_BEFORE_VALUE] = {"<arg_value>", NULL}, [P_VALUE] = {"</arg_value>", NULL},
        [P_AFTER_VALUE] = {"<arg_key>", "</tool_call>"},
    };
    const char *s = p->in.p, *tag;
    size_t n = p->in.n;
    *progress = false;
    if (p->state == P_CONTENT && !p->any_output) { /* a reply may open with its own <think> */
        size_t k = strlen(T_THINK);
        if (n >= k && !memcmp(s, T_THINK, k)) {
            p->state = P_REASONING;
            p->any_output = true;
            *progress = true;
            return consume(p, k);
        }
        if (!final && n < k && !memcmp(s, T_THINK, n)) return SPARK_OK;
    }
    size_t at = find_tag(s, n, want[p->state][0], want[p->state][1], &tag);
    size_t keep = 0;
    if (!tag && !final) {
        keep = partial_tag(s, n, want[p->state][0]);
        if (want[p->state][1]) {
            size_t k2 = partial_tag(s, n, want[p->state][1]);
            keep = k2 > keep ? k2 : keep;
        }
    }
    size_t text_len = at - (tag ? 0 : keep);
    switch (p->state) {
    case P_REASONING:
    case P_CONTENT:
        TRY(push_event(p, p->state == P_REASONING ? SPARK_CHAT_EVENT_REASONING : SPARK_CHAT_EVENT_CONTENT, s,
                       text_len, NULL, NULL));
        sb_drop_front(&p->in, text_len);
        break;
    case P_NAME:
        TRY(sb_put(&p->name, s, text_len));
        TRY(consume(p, text_len));
        break;
    case P_KEY:
        TRY(sb_put(&p->key, s, text_len));
        TRY(consume(p, text_len));
        break;
    case P_VALUE:
        TRY(sb_put(&p->value, s, text_len));
        TRY(consume(p, text_len));
        break;
    case P_BEFORE_VALUE:
    case P_AFTER_VALUE:
        for (size_t i = 0; i < text_len; i++)
            if (!strchr(" \t\r\n", s[i])) return *progress = true, abandon_call(p);
        TRY(consume(p, text_len));
        break;
    }
    *progress = text_len > 0;
    if (!tag) return SPARK_OK;
    *progress = true;
    size_t tl = strlen(tag);
    if (p->state == P_REASONING) {
        sb_drop_front(&p->in, tl);
        p->state = P_CONTENT;
        p->any_output = true; /* a later <think> is text */
        return SPARK_OK;
    }
    if (p->state == P_CONTENT) {
        sb_drop_front(&p->in, tl);
        return begin_call(p);
    }
    TRY(consume(p, tl));
    if (!strcmp(tag, T_END_CALL)) return end_call(p);
    switch (p->state) {
    case P_NAME:
    case P_AFTER_VALUE:
        p->key.n = 0;
        TRY(sb_put(&p->key, "", 0));
        p->state = P_KEY;
        break;
    case P_KEY:
        trim(&p->key);
        p->state = P_BEFORE_VALUE;
        break;
    case P_BEFORE_VALUE:
        p->value.n = 0;
        TRY(sb_put(&p->value, "", 0));
        p->state = P_VALUE;
        break;
    case P_VALUE:
        TRY(add_argument(p));
        p->state = P_AFTER_VALUE;
        break;
    default:
        break;
    }
    return SPARK_OK;
}

static spark_status run(spark_chat_parser *p, bool final)
{
    bool progress = true;
    while (progress && (p->in.n || final)) {
        TRY(step(p, final, &progress));
        if (final && !p->in.n) break;
    }
    return SPARK_OK;
}

/* ---- public ------------------------------------------------------------------------- */

spark_status spark_chat_parser_create(int in_reasoning, const char *tools_json, spark_chat_parser **out)
{
    if (!out) return spark_fail(SPARK_ERR_ARG, "spark_chat_parser_create: NULL argument");
    *out = NULL;
    spark_chat_parser *p = spark_calloc(1, sizeof *p, "chat parser");
    if (!p) return SPARK_ERR_NOMEM;
    p->state = in_reasoning ? P_REASONING : P_CONTENT;
    if (tools_json && tools_json[0]) {
        p->tools = cJSON_Parse(tools_json);
        if (!cJSON_IsArray(p->tools)) {
            spark_chat_parser_free(p);
            return spark_fail(SPARK_ERR_ARG, "chat parser: tools are not a JSON array");
        }
    }
    *out = p;
    return SPARK_OK;
}

void spark_chat_parser_free(spark_chat_parser *p)
{
    if (!p) return;
    p->head = p->n_ev;
    release_returned(p);
    free(p->ev);
    free(p->in.p), free(p->raw.p), free(p->name.p), free(p->key.p), free(p->value.p);
    cJSON_Delete(p->args);
    cJSON_Delete(p->tools);
    free(p);
}

spark_status spark_chat_parser_feed(spark_chat_parser *p, const char *text, size_t len)
{
    if (!p || (!text && len)) return spark_fail(SPARK_ERR_ARG, "spark_chat_parser_feed: NULL argument");
    release_returned(p);
    TRY(sb_put(&p->in, text ? text : "", len));
    return run(p, false);
}

spark_status spark_chat_parser_finish(spark_chat_parser *p)
{
    if (!p) return spark_fail(SPARK_ERR_ARG, "spark_chat_parser_finish: NULL argument");
    release_returned(p);
    TRY(run(p, true));
    if (p->state >= P_NAME) TRY(abandon_call(p));
    if (p->in.n) { /* leftovers after an abandoned call */
        TRY(push_event(p, p->state == P_REASONING ? SPARK_CHAT_EVENT_REASONING : SPARK_CHAT_EVENT_CONTENT,
                       p->in.p, p->in.n, NULL, NULL));
        p->in.n = 0;
    }
    return SPARK_OK;
}

spark_chat_event spark_chat_parser_next(spark_chat_parser *p)
{
    spark_chat_event none = {SPARK_CHAT_EVENT_NONE, NULL, 0, NULL, NULL};
    if (!p || p->head >= p->n_ev) return none;
    return p->ev[p->head++].ev;
}

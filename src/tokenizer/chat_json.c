/*
 * chat_json.c — a conversation from OpenAI-style JSON, for the CLI and the
 * server: `[messages...]` or `{"messages": [...], "tools": [...]}`.
 *
 * The document keeps the parsed cJSON tree and points into its strings; the
 * few strings that must be made (arguments given as objects, content given
 * as an array of text parts, the tools array) are owned by the document.
 */
#include "tokenizer/tokenizer.h"

#include "base/mem.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

struct spark_chat_doc {
    cJSON *root;
    spark_chat_message *messages;
    int32_t n_messages;
    spark_tool_call *calls; /* all messages' calls, back to back */
    char **owned;           /* strings made here */
    int32_t n_owned, cap_owned;
    char *tools_json;
};

static char *own(spark_chat_doc *d, char *s)
{
    if (!s) return NULL;
    if (d->n_owned == d->cap_owned) {
        int32_t cap = d->cap_owned ? d->cap_owned * 2 : 16;
        char **p = realloc(d->owned, (size_t)cap * sizeof *p);
        if (!p) {
            free(s);
            return NULL;
        }
        d->owned = p, d->cap_owned = cap;
    }
    return d->owned[d->n_owned++] = s;
}

static spark_status parse_role(const cJSON *m, int32_t i, spark_chat_role *role)
{
    static const char *const names[SPARK_CHAT_ROLE_COUNT] = {"system", "user", "assistant", "tool"};
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    for (int k = 0; cJSON_IsString(r) && k < SPARK_CHAT_ROLE_COUNT; k++)
        if (!strcmp(r->valuestring, names[k])) return *role = (spark_chat_role)k, SPARK_OK;
    if (cJSON_IsString(r) && !strcmp(r->valuestring, "developer")) return *role = SPARK_CHAT_SYSTEM, SPARK_OK;
    return spark_fail(SPARK_ERR_ARG, "messages[%d]: \"role\" must be system, user, assistant or tool", i);
}

/* "content": a string, null, or [{"type": "text", "text": ...}, ...]. */
static spark_status parse_content(spark_chat_doc *d, const cJSON *v, int32_t i, const char **out)
{
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return SPARK_OK;
    if (cJSON_IsString(v)) return *out = v->valuestring, SPARK_OK;
    if (!cJSON_IsArray(v)) return spark_fail(SPARK_ERR_ARG, "messages[%d]: content is not a string", i);
    size_t n = 1;
    for (const cJSON *p = v->child; p; p = p->next) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(t)) return spark_fail(SPARK_ERR_ARG, "messages[%d]: a content part has no text", i);
        n += strlen(t->valuestring);
    }
    char *s = own(d, malloc(n));
    if (!s) return spark_fail(SPARK_ERR_NOMEM, "out of memory reading messages");
    s[0] = '\0';
    for (const cJSON *p = v->child; p; p = p->next) strcat(s, cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
    *out = s;
    return SPARK_OK;
}

static spark_status parse_call(spark_chat_doc *d, const cJSON *c, int32_t i, spark_tool_call *out)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
    if (!f) f = c; /* also accept {"name", "arguments"} directly */
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
    if (!cJSON_IsString(name)) return spark_fail(SPARK_ERR_ARG, "messages[%d]: a tool call has no name", i);
    out->name = name->valuestring;
    if (cJSON_IsString(args)) out->arguments_json = args->valuestring;
    else if (cJSON_IsObject(args)) out->arguments_json = own(d, cJSON_PrintUnformatted(args));
    else if (!args || cJSON_IsNull(args)) out->arguments_json = "{}";
    else return spark_fail(SPARK_ERR_ARG, "messages[%d]: tool call arguments are not an object", i);
    if (!out->arguments_json) return spark_fail(SPARK_ERR_NOMEM, "out of memory reading messages");
    return SPARK_OK;
}

static spark_status parse_message(spark_chat_doc *d, const cJSON *m, int32_t i, spark_tool_call **next_call)
{
    spark_chat_message *msg = &d->messages[i];
    if (!cJSON_IsObject(m)) return spark_fail(SPARK_ERR_ARG, "messages[%d] is not an object", i);
    TRY(parse_role(m, i, &msg->role));
    TRY(parse_content(d, cJSON_GetObjectItemCaseSensitive(m, "content"), i, &msg->content));
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
    if (cJSON_IsString(rc)) msg->reasoning = rc->valuestring;
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (calls && !cJSON_IsNull(calls)) {
        if (!cJSON_IsArray(calls)) return spark_fail(SPARK_ERR_ARG, "messages[%d]: tool_calls is not an array", i);
        msg->tool_calls = *next_call;
        for (const cJSON *c = calls->child; c; c = c->next) TRY(parse_call(d, c, i, (*next_call)++));
        msg->n_tool_calls = (int32_t)(*next_call - msg->tool_calls);
    }
    return SPARK_OK;
}

static spark_status parse_doc(spark_chat_doc *d)
{
    const cJSON *msgs = d->root, *tools = NULL;
    if (cJSON_IsObject(d->root)) {
        msgs = cJSON_GetObjectItemCaseSensitive(d->root, "messages");
        tools = cJSON_GetObjectItemCaseSensitive(d->root, "tools");
    }
    if (!cJSON_IsArray(msgs)) return spark_fail(SPARK_ERR_ARG, "chat JSON: expected an array of messages or {\"messages\": [...]}");
    int32_t n = cJSON_GetArraySize(msgs), n_calls = 0;
    for (const cJSON *m = msgs->child; m; m = m->next)
        n_calls += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "tool_calls"));
    d->messages = spark_calloc((size_t)n, sizeof *d->messages, "chat messages");
    d->calls = spark_calloc((size_t)n_calls, sizeof *d->calls, "tool calls");
    if (!d->messages || !d->calls) return SPARK_ERR_NOMEM;
    spark_tool_call *next = d->calls;
    int32_t i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) TRY(parse_message(d, m, i, &next));
    d->n_messages = n;
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) return spark_fail(SPARK_ERR_ARG, "chat JSON: \"tools\" is not an array");
        d->tools_json = cJSON_PrintUnformatted(tools);
        if (!d->tools_json) return spark_fail(SPARK_ERR_NOMEM, "out of memory reading tools");
    }
    return SPARK_OK;
}

spark_status spark_chat_doc_parse(const char *json, size_t len, spark_chat_doc **out)
{
    if (!json || !out) return spark_fail(SPARK_ERR_ARG, "spark_chat_doc_parse: NULL argument");
    *out = NULL;
    spark_chat_doc *d = spark_calloc(1, sizeof *d, "chat document");
    if (!d) return SPARK_ERR_NOMEM;
    d->root = cJSON_ParseWithLength(json, len);
    spark_status st = d->root ? parse_doc(d) : spark_fail(SPARK_ERR_ARG, "chat JSON: not valid JSON");
    if (st != SPARK_OK) {
        spark_chat_doc_free(d);
        return st;
    }
    *out = d;
    return SPARK_OK;
}

void spark_chat_doc_free(spark_chat_doc *d)
{
    if (!d) return;
    for (int32_t i = 0; i < d->n_owned; i++) free(d->owned[i]);
    free(d->owned);
    free(d->messages);
    free(d->calls);
    free(d->tools_json);
    cJSON_Delete(d->root);
    free(d);
}

spark_chat spark_chat_doc_view(const spark_chat_doc *d)
{
    spark_chat c = spark_chat_default();
    c.messages = d->messages;
    c.n_messages = d->n_messages;
    c.tools_json = d->tools_json;
    return c;
}

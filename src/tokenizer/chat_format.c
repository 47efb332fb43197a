/*
 * chat_format.c — render a conversation in the Spark chat format (SPEC §6).
 *
 *   <sos><|System|>\nyou are a helpful assistant.[tools block][\n\n{system}]<eos>
 *   <sos><|User|>{content}<eos>
 *   <sos><|Bot|></think>{content}{tool calls}<eos>          (past reasoning dropped)
 *   <sos><|Tool|><tool_response>{r1}</tool_response>...<eos>  (consecutive results, one turn)
 *   <sos><|Bot|><think>   or   <sos><|Bot|></think>           (generation prompt)
 *
 * with <sos> = <｜start▁of▁sentence｜> (id 0) and <eos> = <｜end▁of▁sentence｜>
 * (id 1). A tool call is <tool_call>{name}<arg_key>{k}</arg_key><arg_value>{v}
 * </arg_value>...</tool_call>, string values raw and other values as compact
 * JSON. Every system message's content is appended to the one system turn,
 * in order, each after "\n\n". An assistant content that still holds its
 * reasoning ("...</think>answer") keeps only the part after the last </think>.
 *
 * SPEC §6 names a "tools block" without giving its words; this runtime's
 * block (TOOLS_* below) lists each tool definition as one line of compact
 * JSON and states the call syntax. It is a choice of this project, pinned by
 * the tests (hand-written strings and an independent Jinja2 template).
 *
 * Ids: the markers become their ids directly; the text between two markers
 * is encoded as ONE plain run (added-token text inside it stays text), so
 * a user typing "<|User|>" cannot forge a turn, and a conversation without
 * such text gets exactly the ids of encoding the rendered prompt whole.
 */
#include "tokenizer/tokenizer.h"

#include "base/mem.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define SOS "<｜start▁of▁sentence｜>"
#define EOS "<｜end▁of▁sentence｜>"

static const char SYSTEM_HEAD[] = "\nyou are a helpful assistant.";
static const char TOOLS_INTRO[] =
    "\n\n# Tools\n\nYou may call one or more of the following functions. Each is described by a JSON object:";
static const char TOOLS_CALL_PRE[] = "\n\nTo call a function, reply with ";
static const char TOOLS_CALL_POST[] = "; write string values as they are and other values as JSON.";

typedef struct render {
    const spark_tokenizer *tok; /* NULL when no ids are wanted */
    spark_token_buf *ids;
    char *text;
    size_t len, cap;
    size_t run_start; /* start of the text not yet encoded */
} render;

static spark_status put(render *r, const char *s, size_t n)
{
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 1024;
        while (cap < r->len + n + 1) cap *= 2;
        char *p = realloc(r->text, cap);
        if (!p) return spark_fail(SPARK_ERR_NOMEM, "out of memory rendering a chat");
        r->text = p, r->cap = cap;
    }
    memcpy(r->text + r->len, s, n);
    r->len += n;
    r->text[r->len] = '\0';
    return SPARK_OK;
}

static spark_status text(render *r, const char *s) { return s ? put(r, s, strlen(s)) : SPARK_OK; }

/* Encode the pending plain run (ids only). */
static spark_status flush_run(render *r)
{
    if (r->ids && r->len > r->run_start)
        TRY(spark_tokenizer_encode(r->tok, r->text + r->run_start, r->len - r->run_start, 0, r->ids));
    r->run_start = r->len;
    return SPARK_OK;
}

static spark_status marker(render *r, const char *m)
{
    TRY(flush_run(r));
    size_t n = strlen(m);
    if (r->ids) {
        int32_t id = tok_lookup(r->tok, m, n);
        if (id < 0 || !(r->tok->flags[id] & TOKF_ADDED))
            return spark_fail(SPARK_ERR_UNSUPPORTED, "%s: the chat marker %s is not an added token", r->tok->source, m);
        TRY(tok_buf_reserve(r->ids, 1));
        r->ids->ids[r->ids->n++] = id;
    }
    TRY(put(r, m, n));
    r->run_start = r->len;
    return SPARK_OK;
}

/* ---- pieces of the format ------------------------------------------------------- */

static spark_status tools_block(render *r, const cJSON *tools)
{
    TRY(text(r, TOOLS_INTRO));
    for (const cJSON *t = tools->child; t; t = t->next) {
        char *line = cJSON_PrintUnformatted(t);
        if (!line) return spark_fail(SPARK_ERR_NOMEM, "out of memory printing a tool");
        spark_status st = text(r, "\n");
        if (st == SPARK_OK) st = text(r, line);
        free(line);
        TRY(st);
    }
    TRY(text(r, TOOLS_CALL_PRE));
    TRY(marker(r, "<tool_call>"));
    TRY(text(r, "NAME"));
    TRY(marker(r, "<arg_key>"));
    TRY(text(r, "KEY"));
    TRY(marker(r, "</arg_key>"));
    TRY(marker(r, "<arg_value>"));
    TRY(text(r, "VALUE"));
    TRY(marker(r, "</arg_value>"));
    TRY(text(r, "..."));
    TRY(marker(r, "</tool_call>"));
    return text(r, TOOLS_CALL_POST);
}

static spark_status system_turn(render *r, const spark_chat *c, const cJSON *tools)
{
    TRY(marker(r, SOS));
    TRY(marker(r, "<|System|>"));
    TRY(text(r, SYSTEM_HEAD));
    if (tools && cJSON_GetArraySize(tools) > 0) TRY(tools_block(r, tools));
    for (int32_t i = 0; i < c->n_messages; i++) {
        if (c->messages[i].role != SPARK_CHAT_SYSTEM) continue;
        TRY(text(r, "\n\n"));
        TRY(text(r, c->messages[i].content));
    }
    return marker(r, EOS);
}

static spark_status tool_call(render *r, const spark_tool_call *call, int32_t msg)
{
    if (!call->name || !call->name[0])
        return spark_fail(SPARK_ERR_ARG, "chat message %d: a tool call has no name", msg);
    cJSON *args = call->arguments_json && call->arguments_json[0] ? cJSON_Parse(call->arguments_json)
                                                                  : cJSON_CreateObject();
    if (!cJSON_IsObject(args)) {
        cJSON_Delete(args);
        return spark_fail(SPARK_ERR_ARG, "chat message %d: arguments of tool call \"%s\" are not a JSON object",
                          msg, call->name);
    }
    spark_status st = marker(r, "<tool_call>");
    if (st == SPARK_OK) st = text(r, call->name);
    for (const cJSON *a = args->child; a && st == SPARK_OK; a = a->next) {
        char *v = cJSON_IsString(a) ? NULL : cJSON_PrintUnformatted(a);
        st = marker(r, "<arg_key>");
        if (st == SPARK_OK) st = text(r, a->string);
        if (st == SPARK_OK) st = marker(r, "</arg_key>");
        if (st == SPARK_OK) st = marker(r, "<arg_value>");
        if (st == SPARK_OK) st = text(r, cJSON_IsString(a) ? a->valuestring : v);
        if (st == SPARK_OK) st = marker(r, "</arg_value>");
        free(v);
    }
    if (st == SPARK_OK) st = marker(r, "</tool_call>");
    cJSON_Delete(args);
    return st;
}

/* Past reasoning is dropped, also when it was left inside the content:
 * keep only what follows the last "</think>". */
static const char *answer_part(const char *content)
{
    const char *cut = content;
    for (const char *p = content; p && (p = strstr(p, "</think>")); p += 8) cut = p + 8;
    return cut;
}

static spark_status message(render *r, const spark_chat *c, int32_t i)
{
    const spark_chat_message *m = &c->messages[i];
    switch (m->role) {
    case SPARK_CHAT_SYSTEM:
        return SPARK_OK; /* rendered in the system turn */
    case SPARK_CHAT_USER:
        TRY(marker(r, SOS));
        TRY(marker(r, "<|User|>"));
        TRY(text(r, m->content));
        return marker(r, EOS);
    case SPARK_CHAT_ASSISTANT:
        TRY(marker(r, SOS));
        TRY(marker(r, "<|Bot|>"));
        TRY(marker(r, "</think>"));
        TRY(text(r, answer_part(m->content)));
        for (int32_t k = 0; k < m->n_tool_calls; k++) TRY(tool_call(r, &m->tool_calls[k], i));
        return marker(r, EOS);
    case SPARK_CHAT_TOOL: {
        bool first = i == 0 || c->messages[i - 1].role != SPARK_CHAT_TOOL;
        bool last = i + 1 == c->n_messages || c->messages[i + 1].role != SPARK_CHAT_TOOL;
        if (first) {
            TRY(marker(r, SOS));
            TRY(marker(r, "<|Tool|>"));
        }
        TRY(marker(r, "<tool_response>"));
        TRY(text(r, m->content));
        TRY(marker(r, "</tool_response>"));
        return last ? marker(r, EOS) : SPARK_OK;
    }
    default:
        return spark_fail(SPARK_ERR_ARG, "chat message %d: unknown role %d", i, (int)m->role);
    }
}

static spark_status render_all(render *r, const spark_chat *c)
{
    cJSON *tools = NULL;
    if (c->tools_json && c->tools_json[0]) {
        tools = cJSON_Parse(c->tools_json);
        if (!cJSON_IsArray(tools)) {
            cJSON_Delete(tools);
            return spark_fail(SPARK_ERR_ARG, "chat tools are not a JSON array");
        }
    }
    spark_status st = system_turn(r, c, tools);
    cJSON_Delete(tools);
    for (int32_t i = 0; st == SPARK_OK && i < c->n_messages; i++) st = message(r, c, i);
    if (st == SPARK_OK && c->add_generation_prompt) {
        st = marker(r, SOS);
        if (st == SPARK_OK) st = marker(r, "<|Bot|>");
        if (st == SPARK_OK) st = marker(r, c->enable_thinking ? "<think>" : "</think>");
    }
    if (st == SPARK_OK) st = flush_run(r);
    return st;
}

spark_chat spark_chat_default(void)
{
    return (spark_chat){.messages = NULL, .n_messages = 0, .tools_json = NULL, .enable_thinking = 1,
                        .add_generation_prompt = 1};
}

spark_status spark_chat_render(const spark_tokenizer *tok, const spark_chat *chat, char **text_out,
                               size_t *text_len, spark_token_buf *ids)
{
    if (!chat || (ids && !tok) || (chat->n_messages && !chat->messages))
        return spark_fail(SPARK_ERR_ARG, "spark_chat_render: NULL argument");
    render r = {.tok = ids ? tok : NULL, .ids = ids};
    size_t n0 = ids ? ids->n : 0;
    spark_status st = put(&r, "", 0);
    if (st == SPARK_OK) st = render_all(&r, chat);
    if (st != SPARK_OK || !text_out) {
        free(r.text);
        r.text = NULL;
    }
    if (st != SPARK_OK) {
        if (ids) ids->n = n0;
        return st;
    }
    if (text_out) *text_out = r.text;
    if (text_len) *text_len = r.len;
    return SPARK_OK;
}

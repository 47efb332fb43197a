/*
 * output.c — generated text to OpenAI wire format.
 *
 * Chat replies go through the incremental chat parser, which splits the
 * model's text into reasoning (before </think>), answer content and
 * complete tool calls. Streamed jobs turn each piece into one Server-Sent
 * Event (`data: {chunk}\n\n`) as it arrives and end with a chunk carrying
 * finish_reason, an optional usage chunk and `data: [DONE]`; other jobs
 * collect the pieces and are rendered once, by output_response(), after
 * the job is done. Everything here except output_response() runs on the
 * worker thread.
 */
#include "server/server.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static cJSON *envelope(const job *j, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->model_id);
    return o;
}

/* Send o (consumed) as one SSE event. */
static void publish_event(job *j, cJSON *o)
{
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) return;
    sbuf b = {0};
    if (!sbuf_adds(&b, "data: ") && !sbuf_adds(&b, text) && !sbuf_adds(&b, "\n\n")) job_publish(j, b.p, b.n);
    sbuf_free(&b);
    free(text);
}

/* One streamed chunk: a chat delta (consumed) or completion text. */
static void publish_choice(job *j, cJSON *delta, const char *text, size_t len, const char *finish)
{
    int chat = j->kind == JOB_CHAT;
    cJSON *o = envelope(j, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(choice, "index", 0);
    if (chat) {
        cJSON_AddItemToObject(choice, "delta", delta ? delta : cJSON_CreateObject());
    } else {
        char *t = strndup(text ? text : "", text ? len : 0);
        cJSON_AddStringToObject(choice, "text", t ? t : "");
        free(t);
    }
    cJSON_AddNullToObject(choice, "logprobs");
    if (finish) cJSON_AddStringToObject(choice, "finish_reason", finish);
    else cJSON_AddNullToObject(choice, "finish_reason");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToArray(choices, choice);
    publish_event(j, o);
}

static cJSON *text_delta(const char *key, const char *text, size_t len)
{
    cJSON *d = cJSON_CreateObject();
    char *t = strndup(text, len);
    cJSON_AddStringToObject(d, key, t ? t : "");
    free(t);
    return d;
}

static cJSON *tool_call_json(const tool_call_out *c, int index)
{
    cJSON *o = cJSON_CreateObject();
    if (index >= 0) cJSON_AddNumberToObject(o, "index", index);
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(o, "function");
    cJSON_AddStringToObject(f, "name", c->name);
    cJSON_AddStringToObject(f, "arguments", c->arguments);
    return o;
}

static tool_call_out *add_call(job *j, const spark_chat_event *e)
{
    if (j->n_calls == j->cap_calls) {
        int cap = j->cap_calls ? j->cap_calls * 2 : 4;
        tool_call_out *p = realloc(j->calls, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        j->calls = p;
        j->cap_calls = cap;
    }
    tool_call_out *c = &j->calls[j->n_calls];
    memcpy(c->id, "call_", 5);
    random_id(c->id + 5, 24);
    c->name = strdup(e->name ? e->name : "");
    c->arguments = strdup(e->arguments_json ? e->arguments_json : "{}");
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return NULL;
    }
    j->n_calls++;
    return c;
}

static void on_event(job *j, const spark_chat_event *e)
{
    if (e->kind == SPARK_CHAT_EVENT_TOOL_CALL) {
        tool_call_out *c = add_call(j, e);
        if (!c || !j->stream) return;
        cJSON *d = cJSON_CreateObject();
        cJSON *calls = cJSON_AddArrayToObject(d, "tool_calls");
        cJSON_AddItemToArray(calls, tool_call_json(c, j->n_calls - 1));
        publish_choice(j, d, NULL, 0, NULL);
        return;
    }
    int reasoning = e->kind == SPARK_CHAT_EVENT_REASONING;
    if (!e->len) return;
    if (j->stream) publish_choice(j, text_delta(reasoning ? "reasoning_content" : "content", e->text, e->len), NULL, 0, NULL);
    else sbuf_add(reasoning ? &j->reasoning : &j->content, e->text, e->len);
}

static void drain(job *j)
{
    for (spark_chat_event e; (e = spark_chat_parser_next(j->parser)).kind != SPARK_CHAT_EVENT_NONE;) on_event(j, &e);
}

int output_begin(job *j)
{
    if (j->kind != JOB_CHAT) return 0;
    if (spark_chat_parser_create(j->thinking, j->tools_json, &j->parser) != SPARK_OK) return -1;
    if (j->stream) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "role", "assistant");
        cJSON_AddStringToObject(d, "content", "");
        publish_choice(j, d, NULL, 0, NULL);
    }
    return 0;
}

int output_token(void *user, int32_t id, const char *text, size_t len)
{
    job *j = user;
    (void)id;
    if (j->cancel) return 1;
    if (!len) return 0;
    if (j->kind == JOB_CHAT) {
        spark_chat_parser_feed(j->parser, text, len);
        j->parser_fed = 1;
        drain(j);
    } else if (j->stream) {
        publish_choice(j, NULL, text, len, NULL);
    } else {
        sbuf_add(&j->content, text, len);
    }
    return 0;
}

static const char *finish_reason(const job *j)
{
    spark_finish_reason f = j->result.finish;
    if (f == SPARK_FINISH_LENGTH || f == SPARK_FINISH_CONTEXT) return "length";
    return j->n_calls > 0 ? "tool_calls" : "stop";
}

static cJSON *usage_json(const job *j)
{
    cJSON *u = cJSON_CreateObject();
    int32_t n_prompt = (int32_t)j->prompt.n, n_gen = j->result.n_generated;
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", n_prompt + n_gen);
    cJSON *details = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(details, "cached_tokens", j->n_cached);
    return u;
}

static int error_status(spark_status st)
{
    return st == SPARK_ERR_ARG || st == SPARK_ERR_CONTEXT ? 400 : 500;
}

void output_fail(job *j, int status, const char *msg)
{
    if (j->stream) {
        /* the 200 and the stream's first events are out: the error goes in-band */
        char *e = output_error_json(msg, status < 500 ? "invalid_request_error" : "server_error", NULL, NULL);
        sbuf b = {0};
        if (e && !sbuf_adds(&b, "data: ") && !sbuf_adds(&b, e) && !sbuf_adds(&b, "\n\ndata: [DONE]\n\n"))
            job_publish(j, b.p, b.n);
        sbuf_free(&b);
        free(e);
    }
    job_finish(j, status, msg);
}

void output_end(job *j, spark_status st)
{
    /* a parser never fed holds nothing back; finishing it anyway trips
     * UBSan in the parser (memmem on its NULL buffer) */
    if (j->parser && j->parser_fed) {
        spark_chat_parser_finish(j->parser);
        drain(j);
    }
    if (st != SPARK_OK) {
        output_fail(j, error_status(st), spark_last_error());
        return;
    }
    if (j->stream) {
        publish_choice(j, NULL, "", 0, finish_reason(j));
        if (j->include_usage) {
            cJSON *o = envelope(j, j->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion");
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(j));
            publish_event(j, o);
        }
        job_publish(j, "data: [DONE]\n\n", 14);
    }
    job_finish(j, 0, NULL);
}

static cJSON *chat_message(const job *j)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    if (j->n_calls > 0 && j->content.n == 0) cJSON_AddNullToObject(m, "content");
    else cJSON_AddStringToObject(m, "content", j->content.p ? j->content.p : "");
    if (j->thinking) cJSON_AddStringToObject(m, "reasoning_content", j->reasoning.p ? j->reasoning.p : "");
    if (j->n_calls > 0) {
        cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
        for (int i = 0; i < j->n_calls; i++) cJSON_AddItemToArray(calls, tool_call_json(&j->calls[i], -1));
    }
    return m;
}

char *output_response(const job *j)
{
    int chat = j->kind == JOB_CHAT;
    cJSON *o = envelope(j, chat ? "chat.completion" : "text_completion");
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(choice, "index", 0);
    if (chat) cJSON_AddItemToObject(choice, "message", chat_message(j));
    else cJSON_AddStringToObject(choice, "text", j->content.p ? j->content.p : "");
    cJSON_AddNullToObject(choice, "logprobs");
    cJSON_AddStringToObject(choice, "finish_reason", finish_reason(j));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), choice);
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

char *output_error_json(const char *message, const char *type, const char *param, const char *code)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

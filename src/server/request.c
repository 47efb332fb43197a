/*
 * request.c — an OpenAI request body to a job, or a 4xx naming the field.
 *
 * Every field the server honours is type- and range-checked here, before
 * anything is queued: a request either becomes a complete job (prompt ids,
 * a sampler already created from its parameters, limits that fit the
 * context) or is answered at once with the status, a message and the
 * offending `param`. Fields that would change the meaning of the answer but
 * are not supported (n > 1, logprobs, echo, best_of, suffix, structured
 * output) are refused rather than silently ignored; fields that do not
 * change the answer (user, metadata, store, ...) are accepted and ignored.
 */
#include "server/server.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(api_error *e, int status, const char *param, const char *code, const char *fmt, ...)
{
    e->status = status;
    e->type = status == 400 ? "invalid_request_error" : "server_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return 0;
}

/* The field, or NULL when absent or JSON null (both mean "default"). */
static const cJSON *field(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A number in [lo, hi] (integral when `integer`). Returns 1 with *out set
 * and *present = 1, 1 with *present = 0 when absent, 0 on a bad value. */
static int get_number(const cJSON *o, const char *name, double lo, double hi, int integer, double *out, int *present,
                      api_error *e)
{
    const cJSON *v = field(o, name);
    *present = v != NULL;
    if (!v) return 1;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return fail(e, 400, name, "invalid_type", "'%s' must be a %s", name, integer ? "integer" : "number");
    double x = v->valuedouble;
    if (integer && x != floor(x)) return fail(e, 400, name, "invalid_type", "'%s' must be an integer, got %g", name, x);
    if (x < lo || x > hi) return fail(e, 400, name, "invalid_value", "'%s' must be in [%.10g, %.10g], got %.10g", name, lo, hi, x);
    *out = x;
    return 1;
}

static int get_float(const cJSON *o, const char *name, double lo, double hi, float *out, api_error *e)
{
    double x;
    int present;
    if (!get_number(o, name, lo, hi, 0, &x, &present, e)) return 0;
    if (present) *out = (float)x;
    return 1;
}

static int get_bool(const cJSON *o, const char *name, int *out, api_error *e)
{
    const cJSON *v = field(o, name);
    if (!v) return 1;
    if (!cJSON_IsBool(v)) return fail(e, 400, name, "invalid_type", "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return 1;
}

static int parse_model(server *srv, const cJSON *root, job *j, api_error *e)
{
    const cJSON *m = field(root, "model");
    j->model_id = srv->model_id;
    if (!m) return 1;
    if (!cJSON_IsString(m)) return fail(e, 400, "model", "invalid_type", "'model' must be a string");
    if (strcmp(m->valuestring, srv->model_id))
        return fail(e, 400, "model", "model_not_found", "The model '%.200s' does not exist; this server serves '%s'",
                    m->valuestring, srv->model_id);
    return 1;
}

static int parse_stream(const cJSON *root, job *j, api_error *e)
{
    if (!get_bool(root, "stream", &j->stream, e)) return 0;
    const cJSON *so = field(root, "stream_options");
    if (!so) return 1;
    if (!cJSON_IsObject(so)) return fail(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
    return get_bool(so, "include_usage", &j->include_usage, e);
}

static int add_stop(job *j, const cJSON *s, api_error *e)
{
    if (!cJSON_IsString(s)) return fail(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
    if (!s->valuestring[0]) return 1;
    if (j->n_stop == JOB_MAX_STOP) return fail(e, 400, "stop", "invalid_value", "'stop' takes at most %d strings", JOB_MAX_STOP);
    if (!(j->stop[j->n_stop] = strdup(s->valuestring))) return fail(e, 500, NULL, NULL, "out of memory");
    j->n_stop++;
    return 1;
}

static int parse_stop(const cJSON *root, job *j, api_error *e)
{
    const cJSON *s = field(root, "stop");
    if (!s) return 1;
    if (!cJSON_IsArray(s)) return add_stop(j, s, e);
    for (const cJSON *x = s->child; x; x = x->next)
        if (!add_stop(j, x, e)) return 0;
    return 1;
}

static int parse_max_tokens(const cJSON *root, job *j, api_error *e)
{
    double x = 0;
    int present;
    /* max_completion_tokens is the newer name and wins when both are given */
    static const char *const names[] = {"max_completion_tokens", "max_tokens"};
    for (int i = 0; i < 2; i++) {
        if (!get_number(root, names[i], 1, 2147483647.0, 1, &x, &present, e)) return 0;
        if (present) {
            j->max_tokens = (int32_t)x;
            return 1;
        }
    }
    return 1;
}

/* logit_bias: {"token id": bias in [-100, 100]}; -100 bans the token. */
static int parse_logit_bias(server *srv, const cJSON *root, spark_logit_bias **out, int32_t *n_out, api_error *e)
{
    const cJSON *lb = field(root, "logit_bias");
    if (!lb) return 1;
    if (!cJSON_IsObject(lb)) return fail(e, 400, "logit_bias", "invalid_type", "'logit_bias' must be an object");
    int n = cJSON_GetArraySize(lb);
    spark_logit_bias *b = calloc((size_t)(n ? n : 1), sizeof *b);
    if (!b) return fail(e, 500, NULL, NULL, "out of memory");
    *out = b;
    for (const cJSON *x = lb->child; x; x = x->next) {
        char *end;
        long id = strtol(x->string, &end, 10);
        if (!x->string[0] || *end || id < 0 || id >= srv->n_vocab)
            return fail(e, 400, "logit_bias", "invalid_value", "logit_bias: '%.40s' is not a token id in [0, %d)",
                        x->string, srv->n_vocab);
        if (!cJSON_IsNumber(x) || x->valuedouble < -100 || x->valuedouble > 100)
            return fail(e, 400, "logit_bias", "invalid_value", "logit_bias: the bias of token %ld must be a number in [-100, 100]", id);
        b[*n_out].id = (int32_t)id;
        b[*n_out].bias = x->valuedouble <= -100 ? -INFINITY : (float)x->valuedouble;
        (*n_out)++;
    }
    return 1;
}

static int parse_sampling(server *srv, const cJSON *root, spark_sampler_params *sp, api_error *e)
{
    *sp = spark_model_sampler_defaults(srv->model);
    float top_p = sp->top_p;
    double x;
    int present;
    if (!get_float(root, "temperature", 0, 2, &sp->temperature, e) || !get_float(root, "top_p", 0, 1, &top_p, e) ||
        !get_float(root, "min_p", 0, 1, &sp->min_p, e) ||
        !get_float(root, "presence_penalty", -2, 2, &sp->presence_penalty, e) ||
        !get_float(root, "frequency_penalty", -2, 2, &sp->frequency_penalty, e) ||
        !get_float(root, "repeat_penalty", 1e-6, 1e6, &sp->repeat_penalty, e))
        return 0;
    /* top_p 0 keeps only the most likely token: greedy */
    if (top_p == 0) sp->temperature = 0;
    else sp->top_p = top_p;
    if (!get_number(root, "top_k", 0, 1e9, 1, &x, &present, e)) return 0;
    if (present) sp->top_k = (int32_t)x;
    if (!get_number(root, "seed", -9.2e18, 1.8e19, 1, &x, &present, e)) return 0;
    if (present) sp->seed = x < 0 ? (uint64_t)(int64_t)x : (uint64_t)x;
    else {
        char r[9];
        random_id(r, 8);
        memcpy(&sp->seed, r, sizeof sp->seed);
    }
    return 1;
}

/* Fields whose effect this server does not implement. */
static int refuse_unsupported(const cJSON *root, api_error *e)
{
    double x;
    int present;
    if (!get_number(root, "n", -1e9, 1e9, 1, &x, &present, e)) return 0;
    if (present && x != 1) return fail(e, 400, "n", "invalid_value", "'n' must be 1 (this server returns one choice)");
    if (!get_number(root, "best_of", -1e9, 1e9, 1, &x, &present, e)) return 0;
    if (present && x != 1) return fail(e, 400, "best_of", "invalid_value", "'best_of' must be 1");
    const cJSON *lp = field(root, "logprobs");
    if (lp && !cJSON_IsFalse(lp) && !(cJSON_IsNumber(lp) && lp->valuedouble == 0))
        return fail(e, 400, "logprobs", "unsupported_value", "'logprobs' is not supported");
    if (cJSON_IsTrue(field(root, "echo"))) return fail(e, 400, "echo", "unsupported_value", "'echo' is not supported");
    if (field(root, "suffix")) return fail(e, 400, "suffix", "unsupported_value", "'suffix' is not supported");
    const cJSON *rf = field(root, "response_format"), *type = rf ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    if (rf && !(cJSON_IsString(type) && !strcmp(type->valuestring, "text")))
        return fail(e, 400, "response_format", "unsupported_value", "only response_format {\"type\": \"text\"} is supported");
    return 1;
}

static int parse_common(server *srv, const cJSON *root, job *j, api_error *e)
{
    if (!parse_model(srv, root, j, e) || !parse_stream(root, j, e) || !refuse_unsupported(root, e) ||
        !parse_stop(root, j, e) || !parse_max_tokens(root, j, e))
        return 0;
    spark_sampler_params sp;
    spark_logit_bias *bias = NULL;
    int32_t n_bias = 0;
    int ok = parse_sampling(srv, root, &sp, e) && parse_logit_bias(srv, root, &bias, &n_bias, e);
    if (ok) {
        sp.logit_bias = bias;
        sp.n_logit_bias = n_bias;
        if (spark_sampler_create(&sp, srv->n_vocab, &j->sampler) != SPARK_OK)
            ok = fail(e, 400, NULL, "invalid_value", "%s", spark_last_error());
    }
    free(bias);
    return ok;
}

/* ---- chat ------------------------------------------------------------------ */

static int parse_tools(const cJSON *root, api_error *e)
{
    const cJSON *tools = field(root, "tools");
    if (!tools) return 1;
    if (!cJSON_IsArray(tools)) return fail(e, 400, "tools", "invalid_type", "'tools' must be an array");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
            !cJSON_IsObject(f) || !cJSON_IsString(name) || !name->valuestring[0])
            return fail(e, 400, "tools", "invalid_value",
                        "tools[%d] must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}", i);
    }
    return 1;
}

static int tool_exists(const cJSON *root, const char *name)
{
    const cJSON *tools = field(root, "tools");
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return 1;
    }
    return 0;
}

/* tool_choice: "auto" / "required" / a named function are all answered the
 * same way (the model decides; grammar-forcing is not implemented); "none"
 * stops generation at the tool-call marker. */
static int parse_tool_choice(server *srv, const cJSON *root, job *j, api_error *e)
{
    const cJSON *tc = field(root, "tool_choice");
    if (!tc) return 1;
    if (cJSON_IsString(tc)) {
        const char *v = tc->valuestring;
        if (!strcmp(v, "none")) {
            int32_t id = spark_tokenizer_token_id(srv->tok, "<tool_call>", 11);
            if (id >= 0) j->stop_ids[j->n_stop_ids++] = id;
            return 1;
        }
        if (!strcmp(v, "auto") || !strcmp(v, "required")) return 1;
        return fail(e, 400, "tool_choice", "invalid_value", "'tool_choice' must be none, auto, required or a function");
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(name))
        return fail(e, 400, "tool_choice", "invalid_type", "'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (!tool_exists(root, name->valuestring))
        return fail(e, 400, "tool_choice", "invalid_value", "tool_choice names '%.100s', which is not in 'tools'", name->valuestring);
    return 1;
}

static int parse_thinking(const cJSON *root, job *j, api_error *e)
{
    j->thinking = 1;
    const cJSON *kw = field(root, "chat_template_kwargs");
    if (!kw) return 1;
    if (!cJSON_IsObject(kw))
        return fail(e, 400, "chat_template_kwargs", "invalid_type", "'chat_template_kwargs' must be an object");
    return get_bool(kw, "enable_thinking", &j->thinking, e);
}

static int render_chat(server *srv, const char *body, size_t len, job *j, api_error *e)
{
    spark_chat_doc *doc;
    if (spark_chat_doc_parse(body, len, &doc) != SPARK_OK)
        return fail(e, 400, "messages", "invalid_value", "%s", spark_last_error());
    spark_chat chat = spark_chat_doc_view(doc);
    chat.enable_thinking = j->thinking;
    chat.add_generation_prompt = 1;
    int ok = 1;
    if (chat.tools_json && !(j->tools_json = strdup(chat.tools_json))) ok = fail(e, 500, NULL, NULL, "out of memory");
    if (ok && spark_chat_render(srv->tok, &chat, NULL, NULL, &j->prompt) != SPARK_OK)
        ok = fail(e, 400, "messages", "invalid_value", "%s", spark_last_error());
    spark_chat_doc_free(doc);
    return ok;
}

static int parse_chat(server *srv, const cJSON *root, const char *body, size_t len, job *j, api_error *e)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs) return fail(e, 400, "messages", "missing_required_parameter", "'messages' is a required property");
    if (!cJSON_IsArray(msgs)) return fail(e, 400, "messages", "invalid_type", "'messages' must be an array");
    if (!msgs->child) return fail(e, 400, "messages", "invalid_value", "'messages' must not be empty");
    return parse_tools(root, e) && parse_tool_choice(srv, root, j, e) && parse_thinking(root, j, e) &&
           render_chat(srv, body, len, j, e);
}

/* ---- completions ----------------------------------------------------------- */

static int push_id(spark_token_buf *b, int32_t id, api_error *e)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        int32_t *g = realloc(b->ids, cap * sizeof *g);
        if (!g) return fail(e, 500, NULL, NULL, "out of memory");
        b->ids = g;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return 1;
}

static int prompt_ids(server *srv, const cJSON *p, job *j, api_error *e)
{
    for (const cJSON *x = p->child; x; x = x->next) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble >= srv->n_vocab)
            return fail(e, 400, "prompt", "invalid_value", "'prompt' token ids must be integers in [0, %d)", srv->n_vocab);
        if (!push_id(&j->prompt, (int32_t)x->valuedouble, e)) return 0;
    }
    return 1;
}

static int parse_completion(server *srv, const cJSON *root, job *j, api_error *e)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) return fail(e, 400, "prompt", "missing_required_parameter", "'prompt' is a required property");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    if (cJSON_IsArray(p) && p->child && cJSON_IsNumber(p->child)) {
        if (!prompt_ids(srv, p, j, e)) return 0;
    } else if (cJSON_IsString(p)) {
        uint32_t flags = SPARK_ENCODE_PARSE_SPECIAL;
        if (spark_tokenizer_get_specials(srv->tok).add_bos) flags |= SPARK_ENCODE_ADD_BOS;
        if (spark_tokenizer_encode(srv->tok, p->valuestring, strlen(p->valuestring), flags, &j->prompt) != SPARK_OK)
            return fail(e, 400, "prompt", "invalid_value", "%s", spark_last_error());
    } else {
        return fail(e, 400, "prompt", "invalid_type",
                    "'prompt' must be a string, an array of one string, or an array of token ids");
    }
    /* generation samples from the last prompt position: an empty prompt starts from BOS */
    if (j->prompt.n == 0) return push_id(&j->prompt, spark_model_get_config(srv->model)->bos_id, e);
    return 1;
}

/* ---- the whole request ------------------------------------------------------ */

static int check_context(server *srv, job *j, api_error *e)
{
    int64_t n = (int64_t)j->prompt.n, ctx = srv->n_ctx;
    const char *what = j->kind == JOB_CHAT ? "messages" : "prompt";
    if (n >= ctx)
        return fail(e, 400, what, "context_length_exceeded",
                    "This model's maximum context length is %lld tokens. However, your %s resulted in %lld tokens, "
                    "which leaves no room for the completion.", (long long)ctx, what, (long long)n);
    if (j->max_tokens > 0 && n + j->max_tokens > ctx)
        return fail(e, 400, "max_tokens", "context_length_exceeded",
                    "This model's maximum context length is %lld tokens. However, you requested %lld tokens "
                    "(%lld in the %s, %d in the completion). Please reduce the length of the %s or completion.",
                    (long long)ctx, (long long)(n + j->max_tokens), (long long)n, what, (int)j->max_tokens, what);
    return 1;
}

job *request_parse(server *srv, job_kind kind, const char *body, size_t len, api_error *e)
{
    memset(e, 0, sizeof *e);
    const char *at = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &at, 0);
    if (!root) {
        long off = at && at >= body && at <= body + len ? (long)(at - body) : 0;
        fail(e, 400, NULL, "invalid_json", "We could not parse the JSON body of your request (error near byte %ld).", off);
        return NULL;
    }
    job *j = job_new();
    if (!j) {
        cJSON_Delete(root);
        fail(e, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    j->kind = kind;
    j->created = unix_now();
    j->t_submit = mono_now();
    snprintf(j->id, sizeof j->id, "%s", kind == JOB_CHAT ? "chatcmpl-" : "cmpl-");
    random_id(j->id + strlen(j->id), 24);
    int ok = cJSON_IsObject(root) ? 1 : fail(e, 400, NULL, "invalid_type", "the request body must be a JSON object");
    ok = ok && parse_common(srv, root, j, e);
    ok = ok && (kind == JOB_CHAT ? parse_chat(srv, root, body, len, j, e) : parse_completion(srv, root, j, e));
    ok = ok && check_context(srv, j, e);
    cJSON_Delete(root);
    if (!ok) {
        job_unref(j);
        return NULL;
    }
    return j;
}

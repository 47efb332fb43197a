/*
 * script.c — a test-only stand-in for the model's choices.
 *
 * Small test models cannot be made to emit Spark's tool-call markup, yet the
 * server's parsing and wire format for tool calls must be tested end to end.
 * With SPARK_SERVE_SCRIPT=FILE, `spark serve` replays replies from FILE
 * (separated by lines of just "%%", handed out in turn) instead of sampling:
 * the prompt is still evaluated and each replayed token is still evaluated
 * into the session, so the cache, prefix reuse, streaming, cancelling and
 * usage counts behave as in a real generation. Stop ids end the reply as
 * the model's EOS would; stop strings are not applied.
 */
#include "server/server.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct srv_script {
    char **replies;
    int n;
    unsigned next; /* atomically incremented */
};

static int add_reply(srv_script *s, const char *text, size_t len)
{
    char **p = realloc(s->replies, (size_t)(s->n + 1) * sizeof *p);
    if (!p) return -1;
    s->replies = p;
    if (!(s->replies[s->n] = strndup(text, len))) return -1;
    s->n++;
    return 0;
}

/* Split at lines "%%"; the newline before each separator is not part of a reply. */
static int split_replies(srv_script *s, const char *text)
{
    const char *start = text, *at = text;
    for (;;) {
        const char *sep = strstr(at, "%%");
        if (!sep) return add_reply(s, start, strlen(start));
        int line_start = sep == text || sep[-1] == '\n';
        int line_end = sep[2] == '\n' || sep[2] == '\0';
        if (!line_start || !line_end) {
            at = sep + 2;
            continue;
        }
        size_t len = (size_t)(sep - start);
        if (len && start[len - 1] == '\n') len--;
        if (add_reply(s, start, len)) return -1;
        start = at = sep[2] ? sep + 3 : sep + 2;
    }
}

int script_load(const char *path, srv_script **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    sbuf text = {0};
    char chunk[4096];
    size_t n;
    int rc = 0;
    while (rc == 0 && (n = fread(chunk, 1, sizeof chunk, f)) > 0) rc = sbuf_add(&text, chunk, n);
    fclose(f);
    srv_script *s = calloc(1, sizeof *s);
    if (rc || !s || split_replies(s, text.p ? text.p : "")) {
        sbuf_free(&text);
        script_free(s);
        return -1;
    }
    sbuf_free(&text);
    *out = s;
    return 0;
}

void script_free(srv_script *s)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->replies[i]);
    free(s->replies);
    free(s);
}

static int is_stop_id(const spark_generate_params *p, int32_t id)
{
    for (int32_t i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == id) return 1;
    return 0;
}

/* Replay ids through the detokenizer to the callback, evaluating each. */
static spark_status replay(spark_session *session, const spark_tokenizer *tok, const spark_token_buf *ids,
                           const spark_generate_params *p, spark_generate_result *r)
{
    spark_detokenizer *dt;
    spark_status st = spark_detokenizer_create(tok, p->decode_flags, &dt);
    if (st != SPARK_OK) return st;
    r->finish = SPARK_FINISH_EOS;
    for (size_t i = 0; i < ids->n && st == SPARK_OK; i++) {
        if (p->cancel && *p->cancel) {
            r->finish = SPARK_FINISH_CANCELLED;
            break;
        }
        const char *text;
        size_t len;
        r->n_generated++;
        if (is_stop_id(p, ids->ids[i])) break; /* like the model's EOS: not shown */
        st = spark_detokenizer_push(dt, ids->ids[i], &text, &len);
        if (st == SPARK_OK && p->on_token && p->on_token(p->user, ids->ids[i], text, len)) {
            r->finish = SPARK_FINISH_CANCELLED;
            break;
        }
        if (p->max_tokens > 0 && r->n_generated >= p->max_tokens) {
            r->finish = SPARK_FINISH_LENGTH;
            break;
        }
        if (spark_session_pos(session) + 1 >= spark_session_n_ctx(session)) {
            r->finish = SPARK_FINISH_CONTEXT;
            break;
        }
        if (st == SPARK_OK) st = spark_session_eval(session, &ids->ids[i], 1, NULL, 0);
    }
    const char *tail;
    size_t len;
    if (st == SPARK_OK && r->finish != SPARK_FINISH_CANCELLED && spark_detokenizer_flush(dt, &tail, &len) == SPARK_OK &&
        len && p->on_token)
        p->on_token(p->user, -1, tail, len);
    spark_detokenizer_free(dt);
    return st;
}

spark_status script_generate(srv_script *s, spark_session *session, const spark_tokenizer *tok,
                             const int32_t *prompt, int32_t n_prompt, const spark_generate_params *p,
                             spark_generate_result *r)
{
    *r = (spark_generate_result){.n_prompt = n_prompt};
    double t0 = mono_now();
    spark_status st = spark_session_eval(session, prompt, n_prompt, NULL, 0);
    if (st != SPARK_OK) return st;
    double t1 = mono_now();
    unsigned k = __atomic_fetch_add(&s->next, 1, __ATOMIC_RELAXED);
    const char *reply = s->n ? s->replies[k % (unsigned)s->n] : "";
    spark_token_buf ids = {0};
    st = spark_tokenizer_encode(tok, reply, strlen(reply), SPARK_ENCODE_PARSE_SPECIAL, &ids);
    if (st == SPARK_OK) st = replay(session, tok, &ids, p, r);
    spark_token_buf_free(&ids);
    r->prompt_seconds = t1 - t0;
    r->generate_seconds = mono_now() - t1;
    return st;
}

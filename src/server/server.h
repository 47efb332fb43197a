/*
 * server.h — the pieces of `spark serve`, an OpenAI-compatible HTTP server,
 * and how they fit together.
 *
 * Data flows one way:
 *
 *   http.c      libmicrohttpd glue: routing, auth, body limit, one thread
 *               per connection, waiting on a job (and noticing a client
 *               that hangs up while it waits)
 *   request.c   an OpenAI request body -> a job (prompt ids, sampler,
 *               limits), or a 4xx with a message naming the field
 *   sched.c     N sessions, each with its own worker thread, and a bounded
 *               queue; a job goes to the free session sharing the longest
 *               prompt prefix
 *   run.c       one job on one session: rewind to the shared prefix,
 *               evaluate the rest, generate (or replay a test script)
 *   output.c    generated text -> reasoning / content / tool calls -> SSE
 *               chunks or the final JSON, written into the job
 *   job.c       the job itself: refcounted, its output buffer, cancel flag
 *   metrics.c   counters for /metrics, and the /health and /v1/models bodies
 *   page.c      the chat page served at /
 *   server.c    start and stop the whole thing
 *
 * Threads: libmicrohttpd runs each connection on its own thread; those
 * threads parse requests and tokenize in parallel, then block on their job.
 * Worker threads own one session each and only touch the shared, read-only
 * model and tokenizer.
 */
#ifndef SPARK_SERVER_H
#define SPARK_SERVER_H

#include "spark.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* ---- configuration and lifecycle (server.c) --------------------------- */

typedef struct srv_config {
    const char *model_path;
    int load_mode;       /* spark_load_mode of the weights (0 = auto) */
    const char *host;    /* numeric address or name; default 127.0.0.1 */
    int port;            /* 0: any free port (see server_port) */
    const char *api_key; /* NULL: no auth */
    int parallel;        /* sessions, each its own KV cache and worker thread */
    int n_ctx;           /* per session; 0: min(model max, 4096) */
    int queue;           /* requests waiting beyond the busy sessions */
    int threads;         /* CPU threads per session; 0: cores / parallel */
    int gpu;             /* sessions on the CUDA backend (each holds its own copy of the weights) */
    size_t max_body;     /* request body limit in bytes */
    const char *script;  /* test mode: replies replayed from this file */
    /* called for each session after it is created (e.g. to add steering);
     * returns 0, or non-zero after printing why (the server then fails to start) */
    int (*setup_session)(void *user, spark_model *model, spark_session *session);
    void *setup_user;
} srv_config;

typedef struct server server;

/* Load the model, create the sessions and start listening. Returns 0, or
 * -1 after printing why to stderr (*out is then NULL). */
int server_open(const srv_config *cfg, server **out);

/* The port actually bound (useful with port 0). */
int server_port(const server *srv);

/* Stop accepting, cancel what runs, join every thread, free everything. */
void server_close(server *srv);

/* ---- growable byte buffer -------------------------------------------- */

typedef struct sbuf {
    char *p; /* NUL-terminated when non-NULL */
    size_t n, cap;
} sbuf;

/* Append n bytes; returns 0, or -1 when out of memory (buffer unchanged). */
int sbuf_add(sbuf *b, const char *s, size_t n);
int sbuf_adds(sbuf *b, const char *s);
void sbuf_free(sbuf *b);

/* ---- jobs (job.c) ------------------------------------------------------ */

enum { JOB_MAX_STOP = 16 };

typedef enum job_kind { JOB_CHAT, JOB_COMPLETION } job_kind;

typedef struct tool_call_out {
    char id[32];
    char *name, *arguments; /* owned */
} tool_call_out;

/* One generation request. Fields under "input" are written by request.c
 * before submission and read-only afterwards; "worker" fields belong to the
 * worker running the job; the rest is guarded by `lock`. */
typedef struct job {
    pthread_mutex_t lock;
    pthread_cond_t changed; /* output appended, or done */
    int refs;
    volatile int cancel; /* the client left or the server stops */

    /* input */
    job_kind kind;
    int stream, include_usage, thinking;
    char id[48];
    int64_t created;
    double t_submit; /* mono_now() when parsed, for the log */
    const char *model_id;
    spark_token_buf prompt;
    spark_sampler *sampler; /* owned */
    int32_t max_tokens;
    char *stop[JOB_MAX_STOP];
    int n_stop;
    int32_t stop_ids[2];
    int n_stop_ids;
    char *tools_json; /* owned; NULL without tools */

    /* worker */
    spark_chat_parser *parser;
    int parser_fed; /* text was fed to the parser */
    sbuf content, reasoning;
    tool_call_out *calls;
    int n_calls, cap_calls;
    int32_t n_cached; /* prompt tokens reused from the session's cache */
    spark_generate_result result;

    /* shared, under lock */
    sbuf out; /* streamed bytes not yet taken by the connection */
    int done;
    int err_status; /* non-zero: the job failed with this HTTP status */
    char *err_msg;
    int queued; /* guarded by the scheduler's lock, not this one */
} job;

/* A new job with one reference (the caller's); NULL when out of memory. */
job *job_new(void);
void job_ref(job *j);
/* Drop a reference; the last one frees the job and everything it owns. */
void job_unref(job *j);

/* Append bytes for the connection to send, and wake it. */
void job_publish(job *j, const char *s, size_t n);
/* Mark the job finished (after its last publish), optionally failed with
 * an HTTP status and message; wakes the connection. */
void job_finish(job *j, int err_status, const char *err_msg);

/* Wait up to timeout_ms for output or the end. Returns 1 when there is
 * output to take or the job is done, 0 on timeout. */
int job_wait(job *j, int timeout_ms);

/* Copy up to max pending bytes into buf. Returns the count, or -1 when the
 * job is done and everything was taken. */
long job_take(job *j, char *buf, size_t max);

/* ---- scheduler (sched.c) ----------------------------------------------- */

typedef struct sched sched;

/* Create `n` sessions and their worker threads. Returns 0 or -1 (printed). */
int sched_create(server *srv, int n, const spark_session_options *so, int queue_cap, sched **out);
/* Hand a job over (the scheduler takes its own reference). Returns 0,
 * -1 when the queue is full, -2 when the server is stopping. */
int sched_submit(sched *s, job *j);
/* The client of j left: cancel it and, if still queued, drop it now. */
void sched_abandon(sched *s, job *j);
/* Cancel everything and join the workers (idempotent). */
void sched_stop(sched *s);
void sched_free(sched *s);
/* Snapshot for /metrics and /health. */
void sched_stats(sched *s, int *sessions, int *active, int *queued, int *queue_cap);

/* ---- running a job (run.c) ------------------------------------------- */

void run_job(server *srv, spark_session *session, job *j);

/* Test mode (script.c): replies come from a file instead of the model.
 * The file holds one or more replies separated by lines of just "%%",
 * handed out in turn. */
typedef struct srv_script srv_script;
int script_load(const char *path, srv_script **out);
void script_free(srv_script *s);
/* Like spark_generate, but the generated ids are the next reply's tokens
 * (special-token text such as </think> or <tool_call> parsed). Stop strings
 * are not applied; stop ids, max_tokens, cancel and the context limit are. */
spark_status script_generate(srv_script *s, spark_session *session, const spark_tokenizer *tok,
                             const int32_t *prompt, int32_t n_prompt, const spark_generate_params *p,
                             spark_generate_result *r);

/* ---- output (output.c) ------------------------------------------------- */

/* Before the first token: the chat parser, the stream's first chunk. */
int output_begin(job *j);
/* spark_token_callback: one piece of generated text. */
int output_token(void *user, int32_t id, const char *text, size_t len);
/* After generation: flush the parser, the last chunks, [DONE]; then
 * job_finish. st != SPARK_OK fails the job. */
void output_end(job *j, spark_status st);
/* Fail the job with an HTTP status and message: a streamed job gets an
 * error event and [DONE] (its 200 is already sent); then job_finish. */
void output_fail(job *j, int status, const char *msg);
/* The non-streamed response body of a finished job (malloc'd). */
char *output_response(const job *j);
/* {"error": {...}} (malloc'd). param and code may be NULL. */
char *output_error_json(const char *message, const char *type, const char *param, const char *code);

/* ---- requests (request.c) ---------------------------------------------- */

typedef struct api_error {
    int status; /* HTTP status */
    const char *type, *code;
    char param[64];
    char message[768];
} api_error;

/* Build a job from a /v1/chat/completions or /v1/completions body.
 * Returns the job (one reference), or NULL with *err filled in. */
job *request_parse(server *srv, job_kind kind, const char *body, size_t len, api_error *err);

/* ---- metrics (metrics.c) ------------------------------------------------ */

typedef enum endpoint {
    EP_PAGE, EP_HEALTH, EP_METRICS, EP_MODELS, EP_CHAT, EP_COMPLETIONS, EP_OTHER, EP_COUNT
} endpoint;

typedef struct metrics metrics;
metrics *metrics_new(void);
void metrics_free(metrics *m);
void metrics_request(metrics *m, endpoint ep, int status);
void metrics_generation(metrics *m, const job *j);
void metrics_rejected(metrics *m);
void metrics_cancelled(metrics *m);
/* Prometheus text exposition (malloc'd). */
char *metrics_text(server *srv);
/* /health and /v1/models bodies (malloc'd). */
char *health_json(server *srv);
char *models_json(server *srv, const char *only_id);

/* ---- the chat page (page.c) ---------------------------------------------- */

extern const char chat_page_html[];
size_t chat_page_len(void);

/* ---- the server itself --------------------------------------------------- */

struct server {
    srv_config cfg;
    spark_model *model;
    spark_tokenizer *tok;
    char model_id[128];
    int32_t n_vocab, n_ctx;
    int64_t started;
    sched *sched;
    metrics *metrics;
    srv_script *script; /* test mode, else NULL */
    struct MHD_Daemon *daemon;
    int port;
    int inflight; /* generation requests whose connection has not completed */
};

/* http.c: start / stop the listener. */
int http_start(server *srv);
void http_stop(server *srv);
void http_quiesce(server *srv);
/* Wait (up to timeout_ms) until every generation request has been sent in
 * full, so stopping the daemon does not cut a response short. */
void http_drain(server *srv, int timeout_ms);

/* Random [A-Za-z0-9] text of n characters plus a NUL, for ids. */
void random_id(char *out, size_t n);
/* Seconds since the epoch / a monotonic clock. */
int64_t unix_now(void);
double mono_now(void);

#endif

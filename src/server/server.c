/*
 * server.c — bring `spark serve` up and down: load the model and tokenizer
 * once (shared read-only by every session), create the sessions and their
 * workers, then listen. Shutdown runs in the order that lets every thread
 * finish on its own: stop accepting, cancel and join the workers (which ends
 * every job, so waiting connections return), let the connections send what
 * their jobs wrote, then stop the HTTP threads.
 */
#include "server/server.h"

enum { SERVER_REWIND_SLACK = 512 };

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { DEFAULT_CTX = 4096 };

/* The name clients use for the model: the checkpoint's file or directory
 * name, without .gguf, restricted to characters safe in JSON and URLs. */
static void make_model_id(const char *path, char *out, size_t size)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/') start--;
    if (len - start > 5 && !strncmp(path + len - 5, ".gguf", 5)) len -= 5;
    size_t n = 0;
    for (size_t i = start; i < len && n + 1 < size; i++) {
        char c = path[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
                 c == '_';
        out[n++] = ok ? c : '_';
    }
    out[n] = '\0';
    if (!n) snprintf(out, size, "spark");
}

static int load(server *srv)
{
    const srv_config *c = &srv->cfg;
    spark_model_load_options lo = spark_model_default_load_options();
    lo.mode = (spark_load_mode)c->load_mode;
    if (lo.mode == SPARK_LOAD_AUTO && c->gpu) lo.mode = SPARK_LOAD_MMAP; /* the weights go to the device */
    if (spark_model_load_ex(c->model_path, &lo, &srv->model) != SPARK_OK ||
        spark_tokenizer_load(c->model_path, &srv->tok) != SPARK_OK) {
        fprintf(stderr, "spark serve: %s\n", spark_last_error());
        return -1;
    }
    const spark_model_config *mc = spark_model_get_config(srv->model);
    srv->n_vocab = mc->n_vocab;
    srv->n_ctx = c->n_ctx > 0 ? c->n_ctx : mc->max_ctx < DEFAULT_CTX ? mc->max_ctx : DEFAULT_CTX;
    make_model_id(c->model_path, srv->model_id, sizeof srv->model_id);
    if (c->script && script_load(c->script, &srv->script)) {
        fprintf(stderr, "spark serve: cannot read the test script %s\n", c->script);
        return -1;
    }
    return 0;
}

static int threads_per_session(const srv_config *c)
{
    if (c->threads > 0) return c->threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = cores > 0 ? (int)(cores / c->parallel) : 1;
    return t > 0 ? t : 1;
}

int server_open(const srv_config *cfg, server **out)
{
    *out = NULL;
    server *srv = calloc(1, sizeof *srv);
    if (!srv) return -1;
    srv->cfg = *cfg;
    srv->started = unix_now();
    if (!(srv->metrics = metrics_new()) || load(srv)) {
        server_close(srv);
        return -1;
    }
    spark_session_options so = spark_session_default_options();
    so.n_ctx = srv->n_ctx;
    so.n_threads = threads_per_session(cfg);
    if (cfg->gpu) so.backend = SPARK_BACKEND_CUDA;
    /* a follow-up request usually shares all but the last reply's tail with the
     * previous one: ring slack makes rewinding to the shared prefix free */
    so.n_rewind = SERVER_REWIND_SLACK;
    if (sched_create(srv, cfg->parallel, &so, cfg->queue, &srv->sched) || http_start(srv)) {
        server_close(srv);
        return -1;
    }
    fprintf(stderr, "spark serve: model %s, %d session(s) x %d context, %d thread(s) each, queue %d%s\n",
            srv->model_id, cfg->parallel, srv->n_ctx, so.n_threads, cfg->queue,
            srv->script ? ", TEST MODE: replies scripted" : "");
    *out = srv;
    return 0;
}

int server_port(const server *srv) { return srv->port; }

void server_close(server *srv)
{
    if (!srv) return;
    http_quiesce(srv);
    sched_stop(srv->sched);
    http_drain(srv, 5000);
    http_stop(srv);
    sched_free(srv->sched);
    script_free(srv->script);
    metrics_free(srv->metrics);
    spark_tokenizer_free(srv->tok);
    spark_model_free(srv->model);
    free(srv);
}

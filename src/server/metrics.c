/*
 * metrics.c — what the server has done, for /metrics (Prometheus text
 * format 0.0.4), and the small /health and /v1/models bodies.
 *
 * Counters only grow; gauges (queue depth, busy sessions) are read from the
 * scheduler when scraped. tok/s gauges hold the last finished generation's
 * speeds; rates over time come from the counters (rate(tokens)/rate(seconds)).
 */
#include "server/server.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct metrics {
    pthread_mutex_t lock;
    uint64_t requests[EP_COUNT];
    uint64_t responses[6]; /* by status class: [2] = 2xx ... [5] = 5xx */
    uint64_t rejected, cancelled, generations;
    uint64_t prompt_tokens, cached_tokens, generated_tokens;
    double prompt_seconds, generate_seconds;
    double last_prompt_tps, last_generate_tps;
};

static const char *const endpoint_names[EP_COUNT] = {"page", "health", "metrics", "models", "chat_completions",
                                                     "completions", "other"};

metrics *metrics_new(void)
{
    metrics *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->lock, NULL);
    return m;
}

void metrics_free(metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void metrics_request(metrics *m, endpoint ep, int status)
{
    pthread_mutex_lock(&m->lock);
    m->requests[ep < EP_COUNT ? ep : EP_OTHER]++;
    int cls = status / 100;
    if (cls >= 2 && cls <= 5) m->responses[cls]++;
    pthread_mutex_unlock(&m->lock);
}

void metrics_generation(metrics *m, const job *j)
{
    const spark_generate_result *r = &j->result;
    pthread_mutex_lock(&m->lock);
    m->generations++;
    m->prompt_tokens += (uint64_t)r->n_prompt; /* the tokens actually evaluated */
    m->cached_tokens += (uint64_t)j->n_cached;
    m->generated_tokens += (uint64_t)r->n_generated;
    m->prompt_seconds += r->prompt_seconds;
    m->generate_seconds += r->generate_seconds;
    if (r->prompt_seconds > 0) m->last_prompt_tps = r->n_prompt / r->prompt_seconds;
    if (r->generate_seconds > 0 && r->n_generated > 0) m->last_generate_tps = r->n_generated / r->generate_seconds;
    pthread_mutex_unlock(&m->lock);
}

void metrics_rejected(metrics *m)
{
    pthread_mutex_lock(&m->lock);
    m->rejected++;
    pthread_mutex_unlock(&m->lock);
}

void metrics_cancelled(metrics *m)
{
    pthread_mutex_lock(&m->lock);
    m->cancelled++;
    pthread_mutex_unlock(&m->lock);
}

static void metric(sbuf *b, const char *name, const char *type, const char *help, double value)
{
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, value);
    sbuf_adds(b, line);
}

char *metrics_text(server *srv)
{
    metrics m;
    pthread_mutex_lock(&srv->metrics->lock);
    m = *srv->metrics;
    pthread_mutex_unlock(&srv->metrics->lock);
    int sessions, active, queued, cap;
    sched_stats(srv->sched, &sessions, &active, &queued, &cap);
    sbuf b = {0};
    char line[256];
    sbuf_adds(&b, "# HELP spark_requests_total HTTP requests by endpoint.\n# TYPE spark_requests_total counter\n");
    for (int i = 0; i < EP_COUNT; i++) {
        snprintf(line, sizeof line, "spark_requests_total{endpoint=\"%s\"} %llu\n", endpoint_names[i],
                 (unsigned long long)m.requests[i]);
        sbuf_adds(&b, line);
    }
    sbuf_adds(&b, "# HELP spark_responses_total HTTP responses by status class.\n# TYPE spark_responses_total counter\n");
    for (int c = 2; c <= 5; c++) {
        snprintf(line, sizeof line, "spark_responses_total{code=\"%dxx\"} %llu\n", c, (unsigned long long)m.responses[c]);
        sbuf_adds(&b, line);
    }
    metric(&b, "spark_requests_rejected_total", "counter", "Requests refused with 503 because the queue was full.", (double)m.rejected);
    metric(&b, "spark_requests_cancelled_total", "counter", "Generations cancelled by a client that left.", (double)m.cancelled);
    metric(&b, "spark_generations_total", "counter", "Generations run.", (double)m.generations);
    metric(&b, "spark_prompt_tokens_total", "counter", "Prompt tokens evaluated.", (double)m.prompt_tokens);
    metric(&b, "spark_prompt_tokens_cached_total", "counter", "Prompt tokens reused from a session's cache.", (double)m.cached_tokens);
    metric(&b, "spark_generated_tokens_total", "counter", "Tokens generated.", (double)m.generated_tokens);
    metric(&b, "spark_prompt_seconds_total", "counter", "Seconds spent evaluating prompts.", m.prompt_seconds);
    metric(&b, "spark_generate_seconds_total", "counter", "Seconds spent generating.", m.generate_seconds);
    metric(&b, "spark_prompt_tokens_per_second", "gauge", "Prompt speed of the last generation.", m.last_prompt_tps);
    metric(&b, "spark_generate_tokens_per_second", "gauge", "Generation speed of the last generation.", m.last_generate_tps);
    metric(&b, "spark_sessions", "gauge", "Sessions (KV caches) available.", sessions);
    metric(&b, "spark_sessions_active", "gauge", "Sessions running a request.", active);
    metric(&b, "spark_queue_depth", "gauge", "Requests waiting for a session.", queued);
    metric(&b, "spark_queue_capacity", "gauge", "Requests that may wait before 503.", cap);
    return b.p;
}

char *health_json(server *srv)
{
    int sessions, active, queued, cap;
    sched_stats(srv->sched, &sessions, &active, &queued, &cap);
    char text[256];
    snprintf(text, sizeof text,
             "{\"status\":\"ok\",\"model\":\"%s\",\"sessions\":%d,\"sessions_active\":%d,\"queue_depth\":%d,"
             "\"queue_capacity\":%d}",
             srv->model_id, sessions, active, queued, cap);
    return strdup(text);
}

static cJSON *model_json(server *srv)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)srv->started);
    cJSON_AddStringToObject(m, "owned_by", "spark.c");
    cJSON_AddNumberToObject(m, "context_length", srv->n_ctx);
    return m;
}

char *models_json(server *srv, const char *only_id)
{
    cJSON *o;
    if (only_id) {
        if (strcmp(only_id, srv->model_id)) return NULL;
        o = model_json(srv);
    } else {
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_json(srv));
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

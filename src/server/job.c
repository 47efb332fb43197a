/*
 * job.c — a generation request in flight, shared by the connection that
 * asked for it and the worker that runs it.
 *
 * Ownership is a reference count: the connection holds one, the scheduler
 * one while the job is queued or running, a streaming response one. Output
 * crosses threads through `out`, a byte buffer the worker appends to and the
 * connection drains; `changed` wakes the connection. Also here: the small
 * growable buffer and id / clock helpers the other files share.
 */
#include "server/server.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

int sbuf_add(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

int sbuf_adds(sbuf *b, const char *s) { return sbuf_add(b, s, strlen(s)); }

void sbuf_free(sbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

job *job_new(void)
{
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->lock, NULL);
    /* waits are timed against CLOCK_MONOTONIC so a clock change cannot stall them */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->changed, &ca);
    pthread_condattr_destroy(&ca);
    j->refs = 1;
    return j;
}

void job_ref(job *j)
{
    pthread_mutex_lock(&j->lock);
    j->refs++;
    pthread_mutex_unlock(&j->lock);
}

static void job_free(job *j)
{
    spark_token_buf_free(&j->prompt);
    spark_sampler_free(j->sampler);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->tools_json);
    spark_chat_parser_free(j->parser);
    sbuf_free(&j->content);
    sbuf_free(&j->reasoning);
    for (int i = 0; i < j->n_calls; i++) {
        free(j->calls[i].name);
        free(j->calls[i].arguments);
    }
    free(j->calls);
    sbuf_free(&j->out);
    free(j->err_msg);
    pthread_cond_destroy(&j->changed);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

void job_unref(job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->lock);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->lock);
    if (last) job_free(j);
}

void job_publish(job *j, const char *s, size_t n)
{
    pthread_mutex_lock(&j->lock);
    /* out of memory drops the piece; the stream stays well-formed SSE */
    sbuf_add(&j->out, s, n);
    pthread_cond_broadcast(&j->changed);
    pthread_mutex_unlock(&j->lock);
}

void job_finish(job *j, int err_status, const char *err_msg)
{
    pthread_mutex_lock(&j->lock);
    if (!j->done) {
        j->done = 1;
        j->err_status = err_status;
        if (err_msg) j->err_msg = strdup(err_msg);
    }
    pthread_cond_broadcast(&j->changed);
    pthread_mutex_unlock(&j->lock);
}

int job_wait(job *j, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&j->lock);
    int rc = 0;
    while (!j->done && j->out.n == 0 && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&j->changed, &j->lock, &until);
    int ready = j->done || j->out.n > 0;
    pthread_mutex_unlock(&j->lock);
    return ready;
}

long job_take(job *j, char *buf, size_t max)
{
    pthread_mutex_lock(&j->lock);
    long n = -1;
    if (j->out.n > 0) {
        size_t k = j->out.n < max ? j->out.n : max;
        memcpy(buf, j->out.p, k);
        memmove(j->out.p, j->out.p + k, j->out.n - k + 1); /* with the NUL */
        j->out.n -= k;
        n = (long)k;
    } else if (!j->done) {
        n = 0;
    }
    pthread_mutex_unlock(&j->lock);
    return n;
}

void random_id(char *out, size_t n)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char raw[64];
    if (n > sizeof raw) n = sizeof raw;
    if (getrandom(raw, n, 0) != (ssize_t)n) {
        /* no entropy source: ids only need to be unique, not secret */
        static unsigned long counter;
        unsigned long x = (unsigned long)time(NULL) ^ (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) << 20);
        for (size_t i = 0; i < n; i++) raw[i] = (unsigned char)(x >> (i % 8 * 8)) ^ (unsigned char)(i * 31);
    }
    for (size_t i = 0; i < n; i++) out[i] = alphabet[raw[i] % (sizeof alphabet - 1)];
    out[n] = '\0';
}

int64_t unix_now(void) { return (int64_t)time(NULL); }

double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

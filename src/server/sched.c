/*
 * sched.c — sessions, their worker threads, and the waiting queue.
 *
 * Each slot owns one spark_session (its own KV cache) and one thread that
 * runs the jobs handed to it. A new job goes straight to a free slot when
 * there is one — the free slot whose cached tokens share the longest prefix
 * with the job's prompt, so a conversation that continues lands where its
 * history is already evaluated. With every slot busy the job waits in a
 * bounded FIFO; a full FIFO is the caller's 503. A slot that finishes takes
 * the oldest waiting job.
 *
 * Locking: one mutex guards slot assignment, the queue and `stopping`. A
 * free slot's session is only read (its token list) under that mutex; a busy
 * slot's session belongs to its worker alone.
 */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct slot {
    sched *s;
    spark_session *session;
    pthread_t thread;
    int started;
    pthread_cond_t wake;
    job *job; /* assigned job, NULL when free */
} slot;

struct sched {
    server *srv;
    pthread_mutex_t lock;
    slot *slots;
    int n_slots;
    job **queue; /* ring of cap entries */
    int q_head, q_len, q_cap;
    int stopping;
    int linger_ms; /* tests only: see worker_main */
};

static int32_t common_prefix(const spark_session *session, const spark_token_buf *prompt)
{
    int32_t have = spark_session_pos(session);
    const int32_t *ids = spark_session_tokens(session);
    int32_t n = have < (int32_t)prompt->n ? have : (int32_t)prompt->n, k = 0;
    while (k < n && ids[k] == prompt->ids[k]) k++;
    return k;
}

/* The free slot sharing the longest prefix with j's prompt; NULL if none
 * is free. Ties go to the emptier session, keeping longer caches for the
 * conversations they belong to. */
static slot *best_free_slot(sched *s, const job *j)
{
    slot *best = NULL;
    int32_t best_k = -1, best_pos = 0;
    for (int i = 0; i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->job) continue;
        int32_t k = common_prefix(sl->session, &j->prompt), pos = spark_session_pos(sl->session);
        if (k > best_k || (k == best_k && pos < best_pos)) {
            best = sl;
            best_k = k;
            best_pos = pos;
        }
    }
    return best;
}

static job *queue_pop(sched *s)
{
    if (!s->q_len) return NULL;
    job *j = s->queue[s->q_head];
    s->q_head = (s->q_head + 1) % s->q_cap;
    s->q_len--;
    j->queued = 0;
    return j;
}

static void *worker_main(void *arg)
{
    slot *sl = arg;
    sched *s = sl->s;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!sl->job && !s->stopping) pthread_cond_wait(&sl->wake, &s->lock);
        if (!sl->job) break; /* stopping, nothing assigned */
        job *j = sl->job;
        pthread_mutex_unlock(&s->lock);
        run_job(s->srv, sl->session, j);
        pthread_mutex_lock(&s->lock);
        sl->job = s->stopping ? NULL : queue_pop(s);
        /* The slot lets go of j before its reference is dropped: sched_stop
         * reaches a running job through sl->job under the lock, and j may
         * be freed the moment job_unref returns. */
        pthread_mutex_unlock(&s->lock);
        job_unref(j);
        /* SPARK_SERVE_TEST_LINGER_MS widens the moment between dropping the
         * job and taking the lock again, so a test can stop the server there
         * every time instead of by luck. */
        if (s->linger_ms > 0) nanosleep(&(struct timespec){s->linger_ms / 1000, s->linger_ms % 1000 * 1000000L}, NULL);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

int sched_create(server *srv, int n, const spark_session_options *so, int queue_cap, sched **out)
{
    *out = NULL;
    sched *s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->srv = srv;
    const char *linger = getenv("SPARK_SERVE_TEST_LINGER_MS");
    s->linger_ms = linger ? atoi(linger) : 0;
    pthread_mutex_init(&s->lock, NULL);
    s->slots = calloc((size_t)n, sizeof *s->slots);
    s->q_cap = queue_cap > 0 ? queue_cap : 1;
    s->queue = calloc((size_t)s->q_cap, sizeof *s->queue);
    *out = s;
    if (!s->slots || !s->queue) {
        fprintf(stderr, "spark serve: out of memory creating %d sessions\n", n);
        return -1;
    }
    for (int i = 0; i < n; i++, s->n_slots++) {
        slot *sl = &s->slots[i];
        sl->s = s;
        pthread_cond_init(&sl->wake, NULL);
        if (spark_session_create(srv->model, so, &sl->session) != SPARK_OK) {
            fprintf(stderr, "spark serve: session %d: %s\n", i, spark_last_error());
            return -1;
        }
        if (srv->cfg.setup_session && srv->cfg.setup_session(srv->cfg.setup_user, srv->model, sl->session))
            return -1;
    }
    for (int i = 0; i < n; i++) {
        if (pthread_create(&s->slots[i].thread, NULL, worker_main, &s->slots[i]) != 0) {
            fprintf(stderr, "spark serve: cannot start worker thread %d\n", i);
            return -1;
        }
        s->slots[i].started = 1;
    }
    return 0;
}

int sched_submit(sched *s, job *j)
{
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    slot *sl = s->stopping ? NULL : s->q_len ? NULL : best_free_slot(s, j);
    if (s->stopping) {
        rc = -2;
    } else if (sl) {
        job_ref(j);
        sl->job = j;
        pthread_cond_signal(&sl->wake);
    } else if (s->q_len < s->q_cap) {
        job_ref(j);
        j->queued = 1;
        s->queue[(s->q_head + s->q_len++) % s->q_cap] = j;
    } else {
        rc = -1;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Remove j from the queue (under the lock); returns 1 if it was there. */
static int queue_remove(sched *s, job *j)
{
    if (!j->queued) return 0;
    int at = -1;
    for (int i = 0; i < s->q_len && at < 0; i++)
        if (s->queue[(s->q_head + i) % s->q_cap] == j) at = i;
    if (at < 0) return 0;
    for (int i = at; i + 1 < s->q_len; i++)
        s->queue[(s->q_head + i) % s->q_cap] = s->queue[(s->q_head + i + 1) % s->q_cap];
    s->q_len--;
    j->queued = 0;
    return 1;
}

void sched_abandon(sched *s, job *j)
{
    j->cancel = 1;
    pthread_mutex_lock(&s->lock);
    int removed = queue_remove(s, j);
    pthread_mutex_unlock(&s->lock);
    if (removed) {
        fprintf(stderr, "spark serve: %s: dropped from the queue (client gone)\n", j->id);
        metrics_cancelled(s->srv->metrics);
        job_finish(j, 499, "the client closed the connection");
        job_unref(j); /* the queue's reference */
    }
}

void sched_stop(sched *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    job *waiting[s->q_len > 0 ? s->q_len : 1];
    int n_waiting = 0;
    for (job *j; (j = queue_pop(s));) waiting[n_waiting++] = j;
    for (int i = 0; i < s->n_slots; i++) {
        if (s->slots[i].job) s->slots[i].job->cancel = 1;
        pthread_cond_signal(&s->slots[i].wake);
    }
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < n_waiting; i++) {
        waiting[i]->cancel = 1;
        output_fail(waiting[i], 503, "the server is shutting down");
        job_unref(waiting[i]);
    }
    for (int i = 0; i < s->n_slots; i++) {
        if (s->slots[i].started) pthread_join(s->slots[i].thread, NULL);
        s->slots[i].started = 0;
    }
}

void sched_free(sched *s)
{
    if (!s) return;
    sched_stop(s);
    for (int i = 0; i < s->n_slots; i++) {
        spark_session_free(s->slots[i].session);
        pthread_cond_destroy(&s->slots[i].wake);
    }
    free(s->slots);
    free(s->queue);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void sched_stats(sched *s, int *sessions, int *active, int *queued, int *queue_cap)
{
    pthread_mutex_lock(&s->lock);
    int busy = 0;
    for (int i = 0; i < s->n_slots; i++) busy += s->slots[i].job != NULL;
    *sessions = s->n_slots;
    *active = busy;
    *queued = s->q_len;
    *queue_cap = s->q_cap;
    pthread_mutex_unlock(&s->lock);
}

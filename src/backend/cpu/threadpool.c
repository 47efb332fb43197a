/*
 * threadpool.c — workers that spin briefly, then sleep, between tasks.
 *
 * Protocol: the caller publishes (fn, ctx, nth), sets `pending` to the
 * number of workers and bumps `generation`. A worker that sees a new
 * generation runs its share if its index < nth and decrements `pending`
 * (release); the
 * caller, after running share 0, waits for `pending` == 0 (acquire). A
 * worker spins for SPIN_ROUNDS pause instructions before it sleeps; a sleeping
 * worker registers in `sleepers` first, so the caller only pays for a wake-up
 * system call when somebody actually sleeps.
 */
#include "backend/cpu/threadpool.h"

#include "base/error.h"
#include "base/mem.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

enum { SPIN_ROUNDS = 1 << 15, CALLER_SPIN_ROUNDS = 1 << 12 };

typedef struct worker {
    thread_pool *pool;
    int index;
    pthread_t thread;
} worker;

struct thread_pool {
    int n_threads;
    worker *workers; /* n_threads - 1 of them: indices 1.. */
    pool_task_fn fn;
    void *ctx;
    int nth;
    _Atomic unsigned generation;
    _Atomic int pending;
    _Atomic int sleepers;
    _Atomic int stop;
#if !defined(__linux__)
    pthread_mutex_t lock;
    pthread_cond_t wake;
#endif
};

/* ---- sleeping on the generation word ---------------------------------------- */

static void wait_generation(thread_pool *p, unsigned seen)
{
#if defined(__linux__)
    syscall(SYS_futex, (unsigned *)&p->generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    pthread_mutex_lock(&p->lock);
    while (atomic_load(&p->generation) == seen) pthread_cond_wait(&p->wake, &p->lock);
    pthread_mutex_unlock(&p->lock);
#endif
}

static void wake_all(thread_pool *p)
{
#if defined(__linux__)
    syscall(SYS_futex, (unsigned *)&p->generation, FUTEX_WAKE_PRIVATE, p->n_threads, NULL, NULL, 0);
#else
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
#endif
}

/* Return the first generation different from `seen` (spin, then sleep). */
static unsigned next_generation(thread_pool *p, unsigned seen)
{
    for (;;) {
        for (int i = 0; i < SPIN_ROUNDS; i++) {
            unsigned g = atomic_load_explicit(&p->generation, memory_order_acquire);
            if (g != seen) return g;
            cpu_relax();
        }
        atomic_fetch_add(&p->sleepers, 1);
        /* seq_cst on both sides (here and in pool_run): either the caller sees
         * this sleeper, or this load sees the caller's new generation */
        if (atomic_load(&p->generation) == seen) wait_generation(p, seen);
        atomic_fetch_sub(&p->sleepers, 1);
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    thread_pool *p = w->pool;
    unsigned seen = 0; /* the generation before the first run: a worker that starts late still sees run 1 */
    for (;;) {
        seen = next_generation(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        /* every worker checks in, even one with no share: otherwise it could
         * read (fn, nth) of the NEXT run while still handling this one */
        if (w->index < p->nth) p->fn(p->ctx, w->index, p->nth);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

/* ---- public --------------------------------------------------------------------- */

spark_status pool_create(int n_threads, thread_pool **out)
{
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    thread_pool *p = spark_calloc(1, sizeof *p, "thread pool");
    if (!p) return SPARK_ERR_NOMEM;
    p->n_threads = 1;
#if !defined(__linux__)
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
#endif
    p->workers = spark_calloc((size_t)n_threads, sizeof *p->workers, "thread pool workers");
    if (!p->workers) {
        pool_free(p);
        return SPARK_ERR_NOMEM;
    }
    for (int i = 1; i < n_threads; i++) {
        worker *w = &p->workers[i - 1];
        w->pool = p;
        w->index = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            pool_free(p);
            return spark_fail(SPARK_ERR_INTERNAL, "cannot start CPU worker thread %d of %d", i, n_threads);
        }
        p->n_threads = i + 1; /* workers started so far, so pool_free joins exactly those */
    }
    *out = p;
    return SPARK_OK;
}

void pool_free(thread_pool *p)
{
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    wake_all(p);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->workers[i - 1].thread, NULL);
#if !defined(__linux__)
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
#endif
    free(p->workers);
    free(p);
}

int pool_size(const thread_pool *p) { return p ? p->n_threads : 1; }

void pool_run(thread_pool *p, pool_task_fn fn, void *ctx, int nth)
{
    if (!p || nth > p->n_threads) nth = p ? p->n_threads : 1;
    if (nth <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->nth = nth;
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers) > 0) wake_all(p);
    fn(ctx, 0, nth);
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        if (spins < CALLER_SPIN_ROUNDS) cpu_relax();
        else sched_yield();
    }
}

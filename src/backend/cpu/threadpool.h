/*
 * threadpool.h — a fixed set of worker threads for the CPU kernels, built
 * for many small parallel regions: one decoded token runs a few hundred
 * (every matrix product, attention, ...), each only tens of microseconds.
 *
 * Hand-off is a generation counter: workers spin on it for a short while
 * (about a millisecond) after finishing a task, so the next region starts
 * without a system call, then sleep on a futex (a condition variable off
 * Linux). The calling thread is worker 0 and runs its share itself.
 */
#ifndef SPARK_BACKEND_CPU_THREADPOOL_H
#define SPARK_BACKEND_CPU_THREADPOOL_H

#include "spark.h"

typedef struct thread_pool thread_pool;

/* A parallel task: called once per thread with ith in [0, nth). */
typedef void (*pool_task_fn)(void *ctx, int ith, int nth);

/* Start n_threads - 1 workers (n_threads >= 1; 1 makes a pool that runs
 * everything on the caller). SPARK_ERR_NOMEM / SPARK_ERR_INTERNAL on failure. */
spark_status pool_create(int n_threads, thread_pool **out);

/* Stop and join the workers; NULL is fine. */
void pool_free(thread_pool *pool);

/* Threads in the pool, caller included. */
int pool_size(const thread_pool *pool);

/* Run fn(ctx, i, nth) for i = 0..nth-1, i = 0 on the calling thread, and
 * return when all have finished. nth is clamped to [1, pool_size]. Not
 * reentrant: one run at a time per pool, from one thread at a time. */
void pool_run(thread_pool *pool, pool_task_fn fn, void *ctx, int nth);

#endif

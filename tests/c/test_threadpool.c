/*
 * test_threadpool.c — the CPU backend's thread pool runs every share of a
 * task exactly once (pools of 1-4 threads, asked for more shares than they
 * have), and cpu_split tiles a range in aligned, ordered pieces.
 */
#include "check.h"

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/threadpool.h"

#include <stdatomic.h>

typedef struct count_ctx {
    _Atomic int calls;
    _Atomic long sum;
} count_ctx;

static void count_task(void *arg, int ith, int nth)
{
    count_ctx *c = arg;
    atomic_fetch_add(&c->calls, 1);
    atomic_fetch_add(&c->sum, (long)ith * 1000 + nth);
}

static void test_thread_pool_runs_every_share_once(void)
{
    for (int size = 1; size <= 4; size++) {
        thread_pool *p;
        CHECK(pool_create(size, &p) == SPARK_OK);
        CHECK(pool_size(p) == size);
        for (int round = 0; round < 2000; round++) {
            int nth = 1 + round % (size + 1); /* sometimes more than the pool: clamped */
            int eff = nth > size ? size : nth;
            count_ctx c = {0};
            pool_run(p, count_task, &c, nth);
            long want = 0;
            for (int i = 0; i < eff; i++) want += (long)i * 1000 + eff;
            if (atomic_load(&c.calls) != eff || atomic_load(&c.sum) != want) {
                CHECK_MSG(0, "pool of %d, round %d, nth %d: %d calls", size, round, nth, atomic_load(&c.calls));
                break;
            }
        }
        pool_free(p);
    }
}

static void test_physical_cores_and_split(void)
{
    CHECK(cpu_physical_cores() >= 1);
    for (int nth = 1; nth <= 5; nth++) {
        int64_t prev = 0;
        for (int i = 0; i < nth; i++) {
            int64_t lo, hi;
            cpu_split(1000, 16, i, nth, &lo, &hi);
            CHECK(lo == prev && lo % 16 == 0 && hi >= lo);
            prev = hi;
        }
        CHECK(prev == 1000);
    }
}

int main(void)
{
    RUN(test_thread_pool_runs_every_share_once);
    RUN(test_physical_cores_and_split);
    CHECK_EXIT();
}

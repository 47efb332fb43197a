/*
 * probe.h — measure the two machine limits the CPU backend is judged
 * against: memory bandwidth (decode is bound by it) and peak float32
 * multiply-add throughput (prefill is bound by it). `spark bench` prints its
 * results next to these numbers.
 */
#ifndef SPARK_BACKEND_CPU_PROBE_H
#define SPARK_BACKEND_CPU_PROBE_H

#include "spark.h"

#include <stddef.h>

/* Streaming-read bandwidth in GB/s (1e9 bytes/s): n_threads threads each
 * sum a contiguous slice of a `bytes` buffer (touched first, so no page
 * faults are timed), best of `reps` rounds of one pass in each of the
 * loop's prefetch forms (probe.c). Uses the widest vector loads
 * the CPU has. SPARK_ERR_NOMEM if the buffer cannot be allocated. */
spark_status cpu_probe_bandwidth(int n_threads, size_t bytes, int reps, double *gb_s);

/* A span of memory for cpu_probe_read_pass. */
typedef struct probe_region {
    const void *p;
    size_t bytes;
} probe_region;

struct thread_pool;

/* One timed pass of the bandwidth probe's loop over memory that already
 * exists (spark bench: the model's resident weights, between decoded
 * tokens): every thread of `pool` sums its contiguous share of each region
 * in turn, in one pool run, once in each of the loop's prefetch forms.
 * Returns the fastest form's seconds; *bytes_read (may be
 * NULL) gets the bytes summed: each region trimmed to whole 64-byte lines,
 * each thread's share to whole 256-byte steps. */
double cpu_probe_read_pass(struct thread_pool *pool, const probe_region *r, int n, size_t *bytes_read);
/* The loop's prefetch forms (probe.c: 1 KB ahead to L1, 4 KB to L2, none,
 * 4 KB non-temporal), and a form's name at the active ISA level. */
enum { CPU_PROBE_FORMS = 4 };
const char *cpu_probe_form_name(int form);
/* cpu_probe_read_pass that also gives each form's seconds in
 * form_s[CPU_PROBE_FORMS] (may be NULL). */
double cpu_probe_read_forms(struct thread_pool *pool, const probe_region *r, int n, size_t *bytes_read,
                            double *form_s);

/* Peak float32 multiply-add rate in GFLOP/s (an FMA counts 2) of
 * n_threads threads running independent FMAs on registers at the active
 * ISA level, best of `reps` runs of about 50 ms. */
spark_status cpu_probe_fma_peak(int n_threads, int reps, double *gflop_s);

/* Peak bf16 tile multiply-add rate in GFLOP/s (AMX TDPBF16PS on loaded
 * tiles, 16 x 16 x 32 multiply-adds each) of n_threads threads, best of
 * `reps`; 0 where AMX-BF16 is not usable (amx.c). The prefill path that uses
 * it runs three tile products per float32 product, so its useful peak is a
 * third of this. */
spark_status cpu_probe_amx_peak(int n_threads, int reps, double *gflop_s);

/* The CPU's model name ("Intel(R) Xeon(R) ..."), or "unknown". */
const char *cpu_model_name(void);

#endif

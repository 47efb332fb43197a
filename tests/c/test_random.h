/*
 * test_random.h — the C tests' random numbers: xorshift64 from a fixed seed,
 * so every run draws the same data (a failure reproduces).
 */
#ifndef SPARK_TESTS_RANDOM_H
#define SPARK_TESTS_RANDOM_H

#include <stdint.h>

static uint64_t rng = 88172645463325252ull;

static inline uint64_t next_u64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Uniform in [-1, 1). */
static inline double uniform_d(void) { return (double)(next_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0; }
static inline float uniform(void) { return (float)uniform_d(); }
/* Roughly standard normal (a sum of four uniforms, variance 1): enough for
 * test data, and cheap. */
static inline float gauss(void) { return (uniform() + uniform() + uniform() + uniform()) * 0.866f; }

#endif

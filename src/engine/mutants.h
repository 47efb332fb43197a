/*
 * mutants.h — deliberately broken variants of the forward pass, compiled
 * only into the `make gate-teeth` binaries (-DSPARK_MUTANT=N) to measure
 * what the spark-tiny quality gate can see. A normal build defines none of
 * them, and every macro below is then the identity / empty.
 *
 *   1 rope_swap          each layer class gets the other class's rope
 *   2 gate_after_out     the head gate scales out_proj's output, not the heads
 *   3 window_off_by_one  sliding layers see one key too many (p - j <= window)
 *   4 tanh_gelu          GELU's tanh approximation instead of erf
 */
#ifndef SPARK_ENGINE_MUTANTS_H
#define SPARK_ENGINE_MUTANTS_H

#include <math.h>
#include <stdint.h>

#ifndef SPARK_MUTANT
#define SPARK_MUTANT 0
#endif

#define MUTANT_ROPE_CLASS(kind) (SPARK_MUTANT == 1 ? !(kind) : (kind))
#define MUTANT_WINDOW_EXTRA (SPARK_MUTANT == 3 ? 1 : 0)

/* 2: the projected output element e is scaled by gate e * H / E. */
static inline void mutant_gate_after_out(float *proj, const float *gate_logits, int n, int n_head, int n_embd)
{
    for (int t = 0; t < n; t++)
        for (int e = 0; e < n_embd; e++) {
            float g = gate_logits[(int64_t)t * n_head + (int64_t)e * n_head / n_embd];
            proj[(int64_t)t * n_embd + e] *= 1.0f / (1.0f + expf(-g));
        }
}

/* 4: a = gelu_tanh(a) * b. */
static inline void mutant_tanh_gelu_mul(float *a, const float *b, int64_t count)
{
    for (int64_t i = 0; i < count; i++) {
        float x = a[i];
        a[i] = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))) * b[i];
    }
}

#endif

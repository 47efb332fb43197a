/*
 * hooks.h — the instruments' state inside a session, and the calls the
 * forward pass makes at its fixed points (engine/forward.c):
 *   after a layer's FFN residual add: steering, then capture;
 *   after gelu(gate)*up:              FFN statistics;
 *   around each phase:                timing.
 * On the CPU backend all of it works on the host buffers directly; on a
 * device backend (backend.device_memory) through the backend's instrument
 * ops (steer, copy, ffn_observe, stamp), so a recorded decode step keeps
 * them inside its graph, and results come back with `download`.
 */
#ifndef SPARK_ENGINE_HOOKS_H
#define SPARK_ENGINE_HOOKS_H

#include "spark.h"

#include <stdint.h>

typedef struct steer_entry {
    int32_t layer;
    spark_steer_mode mode;
    float strength;
    float *direction; /* (n_embd) as given */
    float *unit;      /* (n_embd) direction / |direction| */
    float *dev;       /* device backends: a backend buffer [direction | unit] */
} steer_entry;

typedef struct capture_state {
    int on, all_positions;
    int32_t first_layer, last_layer, position;
    float *rows;        /* [count][n_layers][n_embd] */
    int32_t *positions; /* [count] */
    int32_t count, cap;
    /* device backends: the chunk's captured rows are copied into `stage`
     * ([layers][stage_rows][n_embd], a backend buffer) and downloaded once
     * after the chunk; rows stage_t0.. of the chunk */
    float *stage, *host_stage;
    size_t stage_cap, host_cap; /* floats */
    int32_t stage_rows, stage_t0;
} capture_state;

typedef struct ffn_state {
    spark_ffn_stats pub;
    double *mass;
    uint64_t *histogram;
    double *overlap_sum;
    int32_t *prev_top;  /* [n_layer][top_k] previous token's top neurons, sorted */
    int32_t *cur_top;   /* [top_k] scratch */
    uint8_t *has_prev;  /* [n_layer] */
    /* device backends: the accumulators live on the device (backend
     * buffers, same layouts) and are downloaded when read (dirty) */
    double *d_mass, *d_overlap;
    uint64_t *d_hist;
    uint8_t *d_prev, *d_scratch;
    int32_t *d_has_prev;
    int dirty;
} ffn_state;

typedef struct hooks {
    steer_entry *steer;
    int n_steer;
    capture_state capture;
    ffn_state *ffn;
    int timing;
    spark_phase_times times;
} hooks;

struct spark_session;

/* Steering + capture after layer `layer`'s FFN add, for the chunk's n rows
 * at positions pos0.. (x: [n][n_embd]). */
void hooks_after_layer(struct spark_session *s, float *x, int layer, int n, int64_t pos0);

/* FFN statistics on act: [n][n_ff] = gelu(gate x) * up x of `layer`. */
void hooks_ffn_activation(struct spark_session *s, const float *act, int layer, int n);

/* Phases of the timer (the device's stamp sums are indexed by them). */
enum { PHASE_EMBED, PHASE_ATTENTION, PHASE_FFN, PHASE_HOOKS, PHASE_HEAD, PHASE_COUNT };

/* Device backends, capture on: before a chunk (sizes the staging buffer;
 * allocates, so before the chunk's first op) and after it (downloads). */
void hooks_before_chunk(struct spark_session *s, int n, int64_t pos0);
void hooks_after_chunk(struct spark_session *s, int64_t pos0);

/* Device timestamp after `phase` (phase timing on a device backend). */
void hooks_stamp(struct spark_session *s, int phase);

/* Release the instruments' backend buffers (before the backend goes). */
void hooks_release(struct spark_session *s);

/* Are steering/capture active at all (the forward pass's one test per layer)? */
static inline int hooks_any_layer_hook(const hooks *h) { return h->n_steer > 0 || h->capture.on; }

/* Monotonic seconds, for phase timing. */
double hooks_now(void);

void hooks_free(hooks *h);

#endif

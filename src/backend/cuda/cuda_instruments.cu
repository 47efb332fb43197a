/*
 * cuda_instruments.cu — the host side of the instruments on the GPU
 * (engine/hooks.c through backend.h's upload / copy / steer / ffn_observe /
 * stamp / device_times ops; the kernels are in cuda_hooks.cu).
 *
 * Each instrument is one OP_HOOK command: inside a recorded decode step it
 * is recorded and captured into the step's graph with the rest (the
 * persistent step kernel takes no step that has one: such steps run as
 * graphs).
 */
#include "backend/cuda/cuda_state.h"

#include <string.h>

namespace spark_cuda {

void cuda_upload(backend *be, float *buf, const float *host, size_t count)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    flush(cb);
    pair_forget(cb);
    CK(cudaMemcpyAsync(buf, host, count * sizeof(float), cudaMemcpyHostToDevice, cb->st));
    CK(cudaStreamSynchronize(cb->st)); /* pageable source */
}

/* An instrument's arguments: every field zero but its kind. */
static cu_hook_args hook_args(int kind)
{
    cu_hook_args h;
    memset(&h, 0, sizeof h);
    h.kind = kind;
    return h;
}

static void hook(cuda_backend *cb, cu_hook_args *h)
{
    cmd c = new_cmd(OP_HOOK, cb->recording ? 1 : 0);
    c.hk = *h;
    submit(cb, &c);
}

void cuda_copy(backend *be, float *dst, const float *src, size_t count)
{
    use_device(cuda_of(be));
    cu_hook_args h = hook_args(CU_HOOK_COPY);
    h.x = dst;
    h.src = src;
    h.count = (int64_t)count;
    hook(cuda_of(be), &h);
}

void cuda_steer(backend *be, float *x, int n, int dim, int mode, float strength, const float *direction,
                const float *unit)
{
    use_device(cuda_of(be));
    cu_hook_args h = hook_args(CU_HOOK_STEER);
    h.n = n;
    h.dim = dim;
    h.mode = mode;
    h.strength = strength;
    h.x = x;
    h.dir = direction;
    h.unit = unit;
    hook(cuda_of(be), &h);
}

void cuda_ffn_observe(backend *be, const float *act, int n, int n_ff, int top_k, const ffn_observe_bufs *b)
{
    use_device(cuda_of(be));
    cu_hook_args h = hook_args(CU_HOOK_FFN);
    h.n = n;
    h.dim = n_ff;
    h.top_k = top_k;
    h.src = act;
    h.mass = b->mass;
    h.overlap = b->overlap_sum;
    h.hist = (unsigned long long *)b->histogram;
    h.prev = b->prev_top;
    h.scratch = b->scratch;
    h.has_prev = b->has_prev;
    hook(cuda_of(be), &h);
}

enum { STAMP_SLOTS = 16 }; /* [0] the last stamp, [1 + phase] the sums */

void stamps_ready(cuda_backend *cb)
{
    if (cb->stamps) return;
    flush(cb);
    CK(cudaMalloc((void **)&cb->stamps, STAMP_SLOTS * sizeof *cb->stamps));
    CK(cudaMemsetAsync(cb->stamps, 0, STAMP_SLOTS * sizeof *cb->stamps, cb->st));
}

void cuda_stamp(backend *be, int phase)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    if (phase >= STAMP_SLOTS - 1) return;
    if (!cb->stamps) { /* first use: allocate outside any recorded step */
        bool rec = cb->recording;
        if (rec) return; /* (spark_session_timing allocates them: not reached) */
        stamps_ready(cb);
    }
    cu_hook_args h = hook_args(CU_HOOK_STAMP);
    h.phase = phase;
    h.stamps = cb->stamps;
    hook(cb, &h);
}

void cuda_device_times(backend *be, double *out, int count)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    stamps_ready(cb);
    flush(cb);
    unsigned long long v[STAMP_SLOTS];
    CK(cudaMemcpyAsync(v, cb->stamps, sizeof v, cudaMemcpyDeviceToHost, cb->st));
    CK(cudaMemsetAsync(cb->stamps + 1, 0, (STAMP_SLOTS - 1) * sizeof *cb->stamps, cb->st));
    CK(cudaStreamSynchronize(cb->st));
    for (int i = 0; i < count; i++) out[i] = i + 1 < STAMP_SLOTS ? 1e-9 * (double)v[1 + i] : 0;
}

} // namespace spark_cuda

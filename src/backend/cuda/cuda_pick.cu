/*
 * cuda_pick.cu — what sampling reads back from the device instead of the
 * whole logits row (backend.h's pick / pick_read / pick_drop and
 * candidates): the greedy pick, the first id of the largest logit, queued
 * so the next step can run while the host reads it; and the candidates
 * min_p keeps, with their ids and the softmax's total. The kernels are in
 * cuda_kernels.cu (cu_pick, cu_candidates).
 */
#include "backend/cuda/cuda_state.h"

#include <string.h>

namespace spark_cuda {

void pick_copy(cuda_backend *cb)
{
    if (cb->n_picks >= 2) cuda_fatal("pick", "more than two picks queued", __FILE__, __LINE__);
    const int slot = (cb->pick_head + cb->n_picks) % 2;
    CK(cudaMemcpyAsync(cb->pick_host + (size_t)slot * CU_PICK_BLOCKS, cb->pick_keys,
                       CU_PICK_BLOCKS * sizeof *cb->pick_keys, cudaMemcpyDeviceToHost, cb->st));
    CK(cudaEventRecord(cb->pick_ev[slot], cb->st));
    cb->n_picks++;
}

void cuda_pick(backend *be, const float *logits, int count)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    cmd c = new_cmd(OP_PICK, 1);
    c.x = logits;
    c.count = count;
    if (cb->recording) {
        record(cb, &c);
        cb->pick_pending = 1;
        return;
    }
    run_cmd(cb, &c);
    pick_copy(cb);
}

/* Launches a recorded step first: the host then waits only for the pick
 * before it (a step behind, with pick_ahead). */
int32_t cuda_pick_read(backend *be)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    flush(cb);
    if (cb->n_picks == 0) cuda_fatal("pick_read", "no pick queued", __FILE__, __LINE__);
    const int slot = cb->pick_head;
    const double t0 = cb->verbose ? host_now() : 0;
    CK(cudaEventSynchronize(cb->pick_ev[slot]));
    if (cb->verbose) cb->host_wait += host_now() - t0;
    cb->pick_head = (slot + 1) % 2;
    cb->n_picks--;
    return (int32_t)cu_pick_id(cb->pick_host + (size_t)slot * CU_PICK_BLOCKS);
}

/* (a copy still in flight lands in its slot before any later copy there:
 * one stream) */
void cuda_pick_drop(backend *be)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    flush(cb);
    cb->n_picks = 0;
}

/* ---- sampling candidates ---- */

int32_t cuda_candidates(backend *be, const float *logits, int count, float inv_t, float log_min_p, int32_t cap,
                        float *x_out, int32_t *id_out, int *complete, double *total)
{
    cuda_backend *cb = cuda_of(be);
    use_device(cb);
    flush(cb);
    const size_t head = 4 * sizeof(int) + CU_PICK_BLOCKS * sizeof(double), back = head + (size_t)cap * 8;
    const size_t bytes = back + (size_t)CU_PICK_BLOCKS * (CAND_BUCKETS + 1) * sizeof(int) + sizeof(float);
    uint8_t *d = (uint8_t *)scratch(&cb->cand_dev, &cb->cand_dev_bytes, bytes);
    if (cb->cand_host_bytes < back) {
        if (cb->cand_host) CK(cudaFreeHost(cb->cand_host));
        CK(cudaMallocHost(&cb->cand_host, back));
        cb->cand_host_bytes = back;
    }
    cu_cand_buf b;
    b.meta = (int *)d;
    b.tot = (double *)(d + 4 * sizeof(int));
    b.x = (float *)(d + head);
    b.id = (int32_t *)(d + head + (size_t)cap * 4);
    b.hist = (int *)(d + back);
    b.off = b.hist + CU_PICK_BLOCKS * CAND_BUCKETS;
    b.x_max = (float *)(b.off + CU_PICK_BLOCKS);
    CK(cu_pick(cb->st, logits, count, cb->pick_keys, false)); /* its keys give the largest logit */
    CK(cu_candidates(cb->st, logits, count, inv_t, log_min_p, cap, cb->pick_keys, &b));
    CK(cudaMemcpyAsync(cb->cand_host, d, back, cudaMemcpyDeviceToHost, cb->st));
    CK(cudaStreamSynchronize(cb->st));
    const uint8_t *h = (const uint8_t *)cb->cand_host;
    const int *meta = (const int *)h;
    const double *tot = (const double *)(h + 4 * sizeof(int));
    double sum = 0;
    for (int k = 0; k < CU_PICK_BLOCKS; k++) sum += tot[k]; /* in block order: the same total every run */
    *total = sum;
    *complete = meta[1];
    const int32_t n = meta[0];
    memcpy(x_out, h + head, (size_t)n * sizeof(float));
    memcpy(id_out, h + head + (size_t)cap * 4, (size_t)n * sizeof(int32_t));
    return n;
}

} // namespace spark_cuda

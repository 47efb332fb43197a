/*
 * slice_probe.cu — how fast this GPU streams a row-major matrix when each
 * block reads a column slice of it (every row's segment of SEG bytes, rows
 * 20 KB apart) instead of whole rows. A split-K down projection reads the
 * 4B's [2560 x 10240] bf16 down matrix that way (bench/cuda_runs.md run 22:
 * with 80-byte segments the one-launch FFN ran at ~2 TB/s); this says which
 * segment length a split-K form needs to stream like whole rows.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o slice_probe bench/slice_probe.cu
 *   ./slice_probe
 *
 * Each line: a segment length, the matrix cut into 20480 / SEG column
 * slices times enough row groups to make ~264 blocks (2 an SM), each block
 * reading its rows' segments in order, 16-byte `ld.global.cs` loads, every
 * thread 8 in flight; 16 copies of the matrix (840 MB, past the L2) read in
 * turn, 48 launches timed with CUDA events; TB/s and the ratio to the plain
 * row-order read of the same copies. Then the split-K form's adds: 2 x SMs
 * blocks each adding float4s into one 2560-float vector, lane 0 of each warp
 * adding a quad a turn, with every block adding to every quad (run 22's
 * first form: SMs x 2 adds an address) and with blocks in groups of 8 that
 * split the quads (one add an address per group, the cluster form).
 */
#include <cuda_runtime.h>

#define PROBE_NAME "slice_probe"
#include "probe_common.cuh"

#include <stdint.h>
#include <stdio.h>

constexpr int ROWS = 2560, ROW_BYTES = 10240 * 2, COPIES = 16, LAUNCHES = 48;

/* block b: slice b % slices, row group b / slices; its (row, unit) pairs in
 * order, a thread every 256th, 8 loads in flight */
__global__ void slice_kernel(const uint8_t *m, int seg, int slices, int groups, unsigned *sink)
{
    const int s = blockIdx.x % slices, g = blockIdx.x / slices;
    const int r0 = (int)((int64_t)ROWS * g / groups), r1 = (int)((int64_t)ROWS * (g + 1) / groups);
    const int nu = seg / 16;
    const int64_t n = (int64_t)(r1 - r0) * nu;
    unsigned acc = 0;
    for (int64_t i = threadIdx.x; i < n; i += 8 * blockDim.x) {
        uint4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int64_t j = i + (int64_t)k * blockDim.x;
            v[k] = j < n ? __ldcs((const uint4 *)(m + (int64_t)(r0 + j / nu) * ROW_BYTES + (int64_t)s * seg) + j % nu)
                         : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < 8; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}

/* block b adds 1.0 to quads [part * span, part * span + span), part = b % parts */
__global__ void add_kernel(float *vec, int nq, int parts)
{
    const int span = nq / parts, part = blockIdx.x % parts, warp = threadIdx.x / 32;
    if (threadIdx.x % 32) return;
    for (int q = part * span + warp; q < part * span + span; q += blockDim.x / 32)
        atomicAdd((float4 *)(vec + 4 * q), make_float4(1.0f, 1.0f, 1.0f, 1.0f));
}

int main()
{
    const size_t bytes = (size_t)ROWS * ROW_BYTES;
    uint8_t *m;
    unsigned *sink;
    CK(cudaMalloc((void **)&m, bytes * COPIES));
    CK(cudaMalloc((void **)&sink, 4));
    CK(cudaMemset(m, 1, bytes * COPIES));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* us a launch, LAUNCHES launches after one untimed (launch(c): on copy c) */
    auto us_per_launch = [&](auto launch) {
        launch(0);
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0));
        for (int i = 0; i < LAUNCHES; i++) launch(i % COPIES);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        return 1e3 * ms / LAUNCHES;
    };
    auto timed = [&](auto launch) { return (double)bytes / (us_per_launch(launch) * 1e-6) / 1e12; }; /* TB/s */
    const double plain = timed([&](int c) {
        read_kernel<<<2 * sms, 256>>>((const uint4 *)(m + (size_t)c * bytes), bytes / 16, sink);
    });
    printf("plain row-order read: %.3f TB/s (%d blocks)\n", plain, 2 * sms);
    const int segs[] = {80, 160, 320, 640, 1280, 2560, 5120};
    for (int seg : segs) {
        const int slices = ROW_BYTES / seg;
        int groups = (2 * sms + slices - 1) / slices;
        const double tbs = timed([&](int c) {
            slice_kernel<<<slices * groups, 256>>>(m + (size_t)c * bytes, seg, slices, groups, sink);
        });
        printf("segment %5d B: %4d slices x %3d row groups = %4d blocks: %.3f TB/s = %.1f %% of plain\n", seg, slices,
               groups, slices * groups, tbs, 100.0 * tbs / plain);
    }
    float *vec;
    CK(cudaMalloc((void **)&vec, ROWS * sizeof(float)));
    for (int parts : {1, 8}) {
        const double us = us_per_launch([&](int) { add_kernel<<<2 * sms, 256>>>(vec, ROWS / 4, parts); });
        printf("float4 adds: %d blocks, each %d quads of %d (%d adds an address): %.2f us a launch\n", 2 * sms,
               ROWS / 4 / parts, ROWS / 4, 2 * sms / parts, us);
    }
    CK(cudaGetLastError());
    return 0;
}

/*
 * l2_probe.cu — does a weight region pulled into L2 ahead of time make the
 * streaming read that follows faster on this GPU, and which way of pulling
 * it does? (bench/cuda_runs.md run 12 prefetched the out projection into L2
 * during the attention and the GEMVs after it got no faster; this measures
 * the mechanism alone, outside the decode step.)
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o l2_probe bench/l2_probe.cu
 *   ./l2_probe [MB ...]        (default 21 42 105: the out projection, twice it, the gate/up pair)
 *
 * Each line: a region of MB read once by a GEMV-shaped kernel (2 blocks an
 * SM, every thread 8 x 16-byte ld.global.cs loads in flight, the grid
 * striding over the region as fgemv's row groups do), after the L2 was
 * flushed (a 512 MB memset) and then, per scenario:
 *   cold        nothing;
 *   warm        the same read once before;
 *   bulk        cp.async.bulk.prefetch.L2 of 16 KB pieces (the form runs 12 / 18 used);
 *   line_last   prefetch.global.L2::evict_last of every 128-byte line;
 *   line        prefetch.global.L2 of every line;
 * the median of 9 trials of the read's time (CUDA events), its TB/s, and
 * the ratio to cold. Then the overlap the decode step would want: a 10 us
 * kernel on 64 blocks (the attention's) with, on a second stream, a
 * prefetch of the region on 68 blocks, then the read; the whole sequence's
 * time against the same without the prefetch.
 */
#include <cuda_runtime.h>

#define PROBE_NAME "l2_probe"
#include "probe_common.cuh"

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

/* mode 1: bulk 16 KB pieces, 2: every line evict_last, 3: every line */
__global__ void prefetch_kernel(const char *w, size_t bytes, int mode)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nt = (size_t)gridDim.x * blockDim.x;
    if (mode == 1) {
        const size_t piece = 16384;
        for (size_t o = t * piece; o < bytes; o += nt * piece) {
            const unsigned sz = (unsigned)(bytes - o < piece ? bytes - o : piece);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + o), "r"(sz) : "memory");
        }
    } else {
        for (size_t o = t * 128; o < bytes; o += nt * 128) {
            if (mode == 2) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(w + o));
            else asm volatile("prefetch.global.L2 [%0];" ::"l"(w + o));
        }
    }
}

__global__ void spin_kernel(unsigned ns)
{
    const unsigned long long t0 = now_ns();
    while (now_ns() - t0 < ns) {
    }
}

static const char *NAMES[] = {"cold", "warm", "bulk", "line_last", "line"};

int main(int argc, char **argv)
{
    std::vector<double> sizes;
    for (int i = 1; i < argc; i++) sizes.push_back(atof(argv[i]));
    if (sizes.empty()) sizes = {21, 42, 105};
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    const int sms = pr.multiProcessorCount;
    printf("l2_probe: %s, %d SMs, L2 %d MB, persisting max %d MB\n", pr.name, sms, pr.l2CacheSize >> 20,
           pr.persistingL2CacheMaxSize >> 20);
    const size_t flush_bytes = (size_t)512 << 20;
    size_t max_bytes = 0;
    for (double mb : sizes) max_bytes = std::max(max_bytes, (size_t)(mb * 1e6) / 16 * 16);
    char *w, *flush;
    unsigned *sink;
    CK(cudaMalloc(&w, max_bytes));
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(w, 1, max_bytes));
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t e0, e1, fork, join;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    const int rgrid = 2 * sms, TR = 9;
    auto median = [](std::vector<float> v) {
        std::sort(v.begin(), v.end());
        return (double)v[v.size() / 2];
    };
    /* the read, then its end's time since e0 (recorded by the caller), us */
    auto read_since_e0 = [&](size_t bytes) {
        read_kernel<<<rgrid, 256, 0, s1>>>((const uint4 *)w, bytes / 16, sink);
        CK(cudaEventRecord(e1, s1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        return ms * 1e3f;
    };
    for (double mb : sizes) {
        const size_t bytes = (size_t)(mb * 1e6) / 16 * 16;
        double cold_us = 0;
        for (int sc = 0; sc < 5; sc++) {
            std::vector<float> t;
            for (int r = 0; r < TR; r++) {
                CK(cudaMemsetAsync(flush, r, flush_bytes, s1));
                if (sc == 1) read_kernel<<<rgrid, 256, 0, s1>>>((const uint4 *)w, bytes / 16, sink);
                if (sc >= 2) prefetch_kernel<<<rgrid, 256, 0, s1>>>(w, bytes, sc - 1);
                CK(cudaStreamSynchronize(s1));
                CK(cudaEventRecord(e0, s1));
                t.push_back(read_since_e0(bytes));
            }
            const double us = median(t);
            if (sc == 0) cold_us = us;
            printf("%6.0f MB  %-9s  read %7.2f us  %5.2f TB/s  x%.2f of cold\n", mb, NAMES[sc], us, bytes / us / 1e6,
                   us / cold_us);
        }
        /* the overlap: 10 us on 64 blocks, the prefetch beside it on the other SMs, then the read */
        for (int mode = 0; mode <= 3; mode++) {
            std::vector<float> t;
            for (int r = 0; r < TR; r++) {
                CK(cudaMemsetAsync(flush, r, flush_bytes, s1));
                CK(cudaStreamSynchronize(s1));
                CK(cudaEventRecord(e0, s1));
                CK(cudaEventRecord(fork, s1));
                spin_kernel<<<64, 256, 0, s1>>>(10000);
                if (mode) {
                    CK(cudaStreamWaitEvent(s2, fork, 0));
                    prefetch_kernel<<<sms - 64, 256, 0, s2>>>(w, bytes, mode);
                    CK(cudaEventRecord(join, s2));
                    CK(cudaStreamWaitEvent(s1, join, 0));
                }
                t.push_back(read_since_e0(bytes));
            }
            printf("%6.0f MB  overlap 10 us + read, prefetch %-9s  %7.2f us\n", mb,
                   mode ? NAMES[mode + 1] : "none", median(t));
        }
    }
    CK(cudaGetLastError());
    return 0;
}

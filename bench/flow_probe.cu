/*
 * flow_probe.cu — can ONE persistent kernel stream a decode step's weights
 * at the memory's pace while its GEMVs wait on each other? The question a
 * dataflow decode step (issue 6) stands on, asked without the model.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
 *        -o flow_probe bench/flow_probe.cu
 *   ./flow_probe [layers]          (default 36: the 4B shape of SPEC §1)
 *
 * The weights of `layers` layers of the 4B shape (qkv + gate 6160 x 2560,
 * out 2560 x 4096, gate/up pair 2 x 10240 x 2560, down 2560 x 10240; bf16,
 * random) lie in one allocation. One block per SM: a producer warp copies the
 * block's chunks of whole rows (dealt round-robin, so the GPU reads one moving
 * window) into a ring of shared-memory slots with the bulk-copy engine, never
 * waiting for anything but a free slot; 8 consumer warps wait for each slot,
 * multiply its rows with x (fp32, in shared memory) and free it. Per variant:
 *   deps 0   every GEMV reads a fixed x: the pipeline alone;
 *   deps 1   GEMV i waits until every block has finished GEMV i - 1 (a
 *            global counter), then loads x: the chain's sync points;
 *   stall T  after each layer's qkv, 64 blocks spin T us (the attention's
 *            stand-in) and the out projection waits for them.
 * Each line: median time of the pass, TB/s of weight bytes, % of the plain
 * read probe (a grid of ld.global.cs loads over the same bytes) measured in
 * the same run, and block 0's median wait before each GEMV kind.
 * Correctness: the first GEMV's output against a plain kernel's.
 */
#include "backend/cuda/cuda_device.cuh"

#define PROBE_NAME "flow_probe"
#include "probe_common.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

using namespace spark_dev;

constexpr int CW = 8, CTHREADS = CW * WARP, THREADS = CTHREADS + WARP; /* 8 consumer warps + the producer */
constexpr int MAX_SLOTS = 12;

struct op {
    const uint8_t *w0, *w1; /* w1: the pair's second matrix */
    long long rows;
    int cols, row_bytes, pair, rpc, ks;
    const float *x;
    float *out;
    int kind;  /* 0 GEMV, 1 stall */
    int kcls;  /* 0 qkv, 1 out, 2 gate/up, 3 down, 4 stall */
    int stall_ns, stall_blocks;
};

struct params {
    const op *ops;
    int nops, slots, slot_bytes, deps;
    unsigned *cnt;                /* one per op: blocks done */
    unsigned long long *tw;       /* block 0: ns waited before op i */
};

__device__ __forceinline__ unsigned ld_acq(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void cons_sync() { asm volatile("bar.sync 1, %0;" ::"n"(CTHREADS) : "memory"); }

__device__ void producer(const params &P, char *ring, uint64_t *full, uint64_t *empty)
{
    uint32_t seq = 0;
    for (int i = 0; i < P.nops; i++) {
        const op &o = P.ops[i];
        if (o.kind != 0) continue;
        const long long nch = (o.rows + o.rpc - 1) / o.rpc;
        for (long long c = blockIdx.x; c < nch; c += gridDim.x, seq++) {
            const int s = (int)(seq % (uint32_t)P.slots);
            if (seq >= (uint32_t)P.slots) mbar_wait(&empty[s], ((seq / P.slots) - 1) & 1u);
            const long long r0 = c * o.rpc;
            const int nr = (int)(o.rows - r0 < o.rpc ? o.rows - r0 : o.rpc);
            const uint32_t b = (uint32_t)nr * (uint32_t)o.row_bytes;
            char *slot = ring + (size_t)s * P.slot_bytes;
            mbar_expect(&full[s], o.pair ? 2 * b : b);
            bulk_load(slot, o.w0 + r0 * o.row_bytes, b, &full[s]);
            if (o.pair) bulk_load(slot + b, o.w1 + r0 * o.row_bytes, b, &full[s]);
        }
    }
}

__global__ void __launch_bounds__(THREADS, 1) flow_kernel(params P)
{
    extern __shared__ __align__(128) char smem[];
    char *ring = smem;
    float4 *xs4 = (float4 *)(smem + (size_t)P.slots * P.slot_bytes); /* up to 10240 floats */
    __shared__ uint64_t full[MAX_SLOTS], empty[MAX_SLOTS];
    __shared__ float part[2][CW][2];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (threadIdx.x == 0) {
        for (int s = 0; s < P.slots; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CW);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (warp == CW) {
        if (lane == 0) producer(P, ring, full, empty);
        return;
    }
    uint32_t seq = 0;
    for (int i = 0; i < P.nops; i++) {
        const op &o = P.ops[i];
        const unsigned long long t0 = blockIdx.x == 0 && threadIdx.x == 0 ? now_ns() : 0;
        if (P.deps && i > 0 && threadIdx.x == 0) {
            const unsigned need = P.ops[i - 1].kind == 1 ? (unsigned)P.ops[i - 1].stall_blocks : gridDim.x;
            while (ld_acq(&P.cnt[i - 1]) < need) {
            }
        }
        if (blockIdx.x == 0 && threadIdx.x == 0) P.tw[i] += now_ns() - t0;
        if (o.kind == 1) { /* the attention's stand-in */
            cons_sync();
            if ((int)blockIdx.x < o.stall_blocks) {
                if (threadIdx.x == 0) {
                    const unsigned long long e = now_ns() + (unsigned long long)o.stall_ns;
                    while (now_ns() < e) {
                    }
                    __threadfence();
                    atomicAdd(&P.cnt[i], 1u);
                }
            }
            continue;
        }
        cons_sync(); /* the previous op's x is read by all; the dependency is met */
        const int nvec = o.cols / 8;
        for (int j = threadIdx.x; j < o.cols / 4; j += CTHREADS)
            xs4[(j % 2) * nvec + j / 2] = __ldcg((const float4 *)o.x + j);
        cons_sync();
        const int rl = warp / o.ks, sg = warp % o.ks;
        const int seglen = nvec / o.ks, u0 = sg * seglen;
        const long long nch = (o.rows + o.rpc - 1) / o.rpc;
        for (long long c = blockIdx.x; c < nch; c += gridDim.x, seq++) {
            const int s = (int)(seq % (uint32_t)P.slots);
            mbar_wait(&full[s], (seq / P.slots) & 1u);
            const long long r0 = c * o.rpc;
            const int nr = (int)(o.rows - r0 < o.rpc ? o.rows - r0 : o.rpc);
            const uint4 *slot = (const uint4 *)(ring + (size_t)s * P.slot_bytes);
            float a0 = 0.0f, a1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
            if (rl < nr) {
                const uint4 *wr = slot + (size_t)rl * nvec;
                const uint4 *wu = slot + (size_t)(nr + rl) * nvec;
                int u = u0 + lane;
                for (; u + WARP < u0 + seglen; u += 2 * WARP) {
                    const float4 xa = xs4[u], xb = xs4[nvec + u], xc = xs4[u + WARP], xd = xs4[nvec + u + WARP];
                    a0 = dot_bf16x8(wr[u], xa, xb, a0);
                    a1 = dot_bf16x8(wr[u + WARP], xc, xd, a1);
                    if (o.pair) {
                        b0 = dot_bf16x8(wu[u], xa, xb, b0);
                        b1 = dot_bf16x8(wu[u + WARP], xc, xd, b1);
                    }
                }
                if (u < u0 + seglen) {
                    const float4 xa = xs4[u], xb = xs4[nvec + u];
                    a0 = dot_bf16x8(wr[u], xa, xb, a0);
                    if (o.pair) b0 = dot_bf16x8(wu[u], xa, xb, b0);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);
            float a = warp_sum(a0 + a1), b = o.pair ? warp_sum(b0 + b1) : 0.0f;
            if (o.ks == 1) {
                if (lane == 0 && rl < nr) {
                    if (o.pair) o.out[r0 + rl] = 0.5f * a * (1.0f + erff(a * 0.70710678f)) * b;
                    else o.out[r0 + rl] = a;
                }
            } else {
                if (lane == 0) {
                    part[seq & 1][warp][0] = a;
                    part[seq & 1][warp][1] = b;
                }
                cons_sync();
                if ((int)threadIdx.x < nr) {
                    float sa = 0.0f, sb = 0.0f;
                    for (int k = 0; k < o.ks; k++) {
                        sa += part[seq & 1][threadIdx.x * o.ks + k][0];
                        sb += part[seq & 1][threadIdx.x * o.ks + k][1];
                    }
                    if (o.pair) o.out[r0 + threadIdx.x] = 0.5f * sa * (1.0f + erff(sa * 0.70710678f)) * sb;
                    else o.out[r0 + threadIdx.x] = sa;
                }
            }
        }
        if (P.deps) {
            __threadfence();
            cons_sync();
            if (threadIdx.x == 0) atomicAdd(&P.cnt[i], 1u);
        }
    }
}

__global__ void fill_kernel(uint32_t *w, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        /* two bf16 in [-1/64, 1/64): exponent 0x3C (2^-7 .. 2^-6 scale), random mantissa and sign */
        const uint32_t lo = 0x3C00u | (h & 0x807Fu), hi = 0x3C00u | ((h >> 16) & 0x807Fu);
        w[i] = lo | hi << 16;
    }
}

__global__ void fillf_kernel(float *x, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2246822519u ^ seed;
        h ^= h >> 13;
        h *= 2654435761u;
        x[i] = (float)(h >> 8) / 16777216.0f - 0.5f;
    }
}

__global__ void ref_kernel(const uint16_t *w, const float *x, float *out, int rows, int cols)
{
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    double s = 0;
    for (int c = 0; c < cols; c++) s += (double)__uint_as_float((uint32_t)w[(size_t)r * cols + c] << 16) * x[c];
    out[r] = (float)s;
}

static float median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv)
{
    const int layers = argc > 1 ? atoi(argv[1]) : 36;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    const int H = 2560, QKV = 6144 + 16, OUTC = 4096, FF = 10240;
    const size_t per_layer = (size_t)QKV * H * 2 + (size_t)H * OUTC * 2 + 2 * (size_t)FF * H * 2 + (size_t)H * FF * 2;
    const size_t total = per_layer * layers;
    uint8_t *W;
    CK(cudaMalloc(&W, total));
    fill_kernel<<<4 * sms, 256>>>((uint32_t *)W, total / 4, 12345u);
    float *X, *O;
    CK(cudaMalloc(&X, 4 * sizeof(float) * FF));
    CK(cudaMalloc(&O, 4 * sizeof(float) * FF * 2));
    fillf_kernel<<<64, 256>>>(X, 4 * FF, 777u);
    unsigned *sink;
    CK(cudaMalloc(&sink, 4));
    CK(cudaDeviceSynchronize());
    printf("flow_probe: %s, %d SMs, %d layers, %.3f GB of weights\n", prop.name, sms, layers, total / 1e9);

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto time_it = [&](auto launch, int reps) {
        std::vector<float> ts;
        launch();
        CK(cudaDeviceSynchronize());
        for (int r = 0; r < reps; r++) {
            CK(cudaEventRecord(e0));
            launch();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            ts.push_back(ms);
        }
        CK(cudaGetLastError());
        return median(ts);
    };
    const float t_read = time_it([&] { read_kernel<<<sms * 4, 256>>>((const uint4 *)W, total / 16, sink); }, 9);
    const double bw_read = total / (t_read * 1e-3) / 1e12;
    printf("plain read: %.3f ms, %.3f TB/s\n", t_read, bw_read);

    unsigned *cnt;
    unsigned long long *tw;
    const int max_ops = layers * 5 + 1;
    CK(cudaMalloc(&cnt, max_ops * sizeof(unsigned)));
    CK(cudaMalloc(&tw, max_ops * sizeof(unsigned long long)));
    op *d_ops;
    CK(cudaMalloc(&d_ops, max_ops * sizeof(op)));

    struct variant {
        int slot_kb, slots, deps, stall_us;
    };
    const variant vs[] = {{40, 4, 0, 0}, {40, 4, 1, 0}, {40, 4, 1, 5},  {40, 4, 1, 10}, {20, 8, 1, 10},
                          {20, 9, 1, 10}, {40, 3, 1, 10}, {20, 6, 1, 10}, {40, 4, 0, 0}};
    printf("%-28s %9s %8s %8s | block 0's median wait before (us): qkv out gate/up down\n", "variant", "ms",
           "TB/s", "% read");
    for (const variant &v : vs) {
        const int slot = v.slot_kb * 1024;
        std::vector<op> ops;
        const uint8_t *p = W;
        auto gemv = [&](long long rows, int cols, int pair, int kcls, int xi) {
            op o = {};
            o.w0 = p;
            o.w1 = pair ? p + (size_t)rows * cols * 2 : NULL;
            p += (size_t)rows * cols * 2 * (pair ? 2 : 1);
            o.rows = rows;
            o.cols = cols;
            o.row_bytes = cols * 2;
            o.pair = pair;
            int r = 8;
            while (r > 1 && (size_t)r * o.row_bytes * (pair ? 2 : 1) > (size_t)slot) r /= 2;
            o.rpc = r;
            o.ks = CW / r;
            o.x = X + xi * FF;
            o.out = O + kcls * FF * 2;
            o.kcls = kcls;
            ops.push_back(o);
        };
        for (int l = 0; l < layers; l++) {
            gemv(QKV, H, 0, 0, 0);
            if (v.stall_us) {
                op s = {};
                s.kind = 1;
                s.kcls = 4;
                s.stall_ns = v.stall_us * 1000;
                s.stall_blocks = 64;
                ops.push_back(s);
            }
            gemv(H, OUTC, 0, 1, 1);
            gemv(FF, H, 1, 2, 2);
            gemv(H, FF, 0, 3, 3);
        }
        CK(cudaMemcpy(d_ops, ops.data(), ops.size() * sizeof(op), cudaMemcpyHostToDevice));
        params P = {};
        P.ops = d_ops;
        P.nops = (int)ops.size();
        P.slots = v.slots;
        P.slot_bytes = slot;
        P.deps = v.deps;
        P.cnt = cnt;
        P.tw = tw;
        const size_t smem = (size_t)v.slots * slot + (size_t)FF * sizeof(float);
        if (smem > (size_t)prop.sharedMemPerBlockOptin - 1024) {
            printf("%dx%d KB: %zu bytes of shared memory, too many\n", v.slots, v.slot_kb, smem);
            continue;
        }
        CK(cudaFuncSetAttribute(flow_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        const int reps = 7;
        CK(cudaMemset(tw, 0, max_ops * sizeof(unsigned long long)));
        const float t = time_it(
            [&] {
                cudaMemsetAsync(cnt, 0, max_ops * sizeof(unsigned));
                flow_kernel<<<sms, THREADS, smem>>>(P);
            },
            reps);
        std::vector<unsigned long long> h(ops.size());
        CK(cudaMemcpy(h.data(), tw, ops.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        std::vector<float> wk[5];
        for (size_t i = 0; i < ops.size(); i++) wk[ops[i].kcls].push_back(h[i] / 1e3f / (reps + 1));
        char name[64];
        snprintf(name, sizeof name, "%dx%dKB deps %d stall %dus", v.slots, v.slot_kb, v.deps, v.stall_us);
        const double bw = total / (t * 1e-3) / 1e12;
        printf("%-28s %9.3f %8.3f %7.1f%% | %.2f %.2f %.2f %.2f (stall op %.2f) ms/layer %.1f us\n", name, t, bw,
               100.0 * bw / bw_read, median(wk[0]), median(wk[1]), median(wk[2]), median(wk[3]),
               wk[4].empty() ? 0.0f : median(wk[4]), t * 1e3 / layers);
    }
    /* correctness: the last variant's qkv against a float64 product */
    float *R;
    CK(cudaMalloc(&R, QKV * sizeof(float)));
    std::vector<float> a(QKV), b(QKV);
    CK(cudaMemcpy(a.data(), O, QKV * sizeof(float), cudaMemcpyDeviceToHost));
    /* O holds the LAST layer's qkv output (each chunk's block runs the layers in order) */
    ref_kernel<<<(QKV + 127) / 128, 128>>>((const uint16_t *)(W + per_layer * (layers - 1)), X, R, QKV, H);
    CK(cudaMemcpy(b.data(), R, QKV * sizeof(float), cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int i = 0; i < QKV; i++) {
        num += (double)(a[i] - b[i]) * (a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    printf("check: last layer's qkv vs float64: rel L2 %.2e\n", sqrt(num / den));
    return 0;
}

/*
 * cuda_probe.cu — what the CLI asks of a GPU without a model: whether there
 * is one, its memory, and its two physical limits (`spark bench --gpu`
 * reports decode against the copy bandwidth and prefill against the bf16
 * matrix peak, both measured here rather than taken from a datasheet).
 */
#include "backend/cuda/cuda_state.h"

#include <stdio.h>

using namespace spark_cuda;

extern "C" int backend_cuda_available(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count > 0;
}

extern "C" int spark_cuda_available(void) { return backend_cuda_available(); }

namespace {

/* Median of n timings (ms) of `work` on `st`, each between two events. */
template <typename F> float median_ms(cudaStream_t st, int n, F work)
{
    cudaEvent_t a, b;
    float t[16], ms = 0;
    if (n > 16) n = 16;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < n; i++) {
        CK(cudaEventRecord(a, st));
        work();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[i], a, b));
    }
    for (int i = 1; i < n; i++) /* insertion sort: n is tiny */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            float x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    ms = t[n / 2];
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms;
}

} // namespace

extern "C" spark_status backend_cuda_probe(int device, size_t bytes, double *copy_gb_s, double *bf16_tflop_s)
{
    *copy_gb_s = *bf16_tflop_s = 0;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
        cudaGetLastError();
        return spark_fail(SPARK_ERR_UNSUPPORTED, "no CUDA device: none to probe (device %d)", device);
    }
    CK(cudaSetDevice(device));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *x = NULL, *y = NULL;
    if (cudaMalloc(&x, bytes) != cudaSuccess || cudaMalloc(&y, bytes) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(x);
        cudaStreamDestroy(st);
        return spark_fail(SPARK_ERR_NOMEM, "CUDA device %d: no room for the %.1f GB bandwidth probe", device,
                          2.0 * (double)bytes / 1e9);
    }
    CK(cudaMemsetAsync(x, 1, bytes, st));
    for (int i = 0; i < 3; i++) CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, st));
    float ms = median_ms(st, 10, [&] { CK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, st)); });
    *copy_gb_s = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
    CK(cudaFree(x));
    CK(cudaFree(y));

    /* the matrix peak: bf16 inputs, fp32 accumulation, as the prefill GEMMs */
    const int N = 8192;
    const size_t mat = (size_t)N * N;
    void *A = NULL, *B = NULL, *C = NULL;
    cublasHandle_t h = NULL;
    bool ok = cudaMalloc(&A, mat * 2) == cudaSuccess && cudaMalloc(&B, mat * 2) == cudaSuccess &&
              cudaMalloc(&C, mat * 4) == cudaSuccess && cublasCreate(&h) == CUBLAS_STATUS_SUCCESS;
    if (ok) {
        CKB(cublasSetStream(h, st));
        CK(cudaMemsetAsync(A, 0x3c, mat * 2, st)); /* bf16 0x3c3c: a normal number */
        CK(cudaMemsetAsync(B, 0x3c, mat * 2, st));
        const float one = 1.0f, zero = 0.0f;
        auto gemm = [&] {
            CKB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N, B, CUDA_R_16BF, N, &zero, C,
                             CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        };
        gemm();
        ms = median_ms(st, 5, gemm);
        *bf16_tflop_s = 2.0 * N * (double)N * N / (ms * 1e-3) / 1e12;
    }
    cudaGetLastError();
    if (h) cublasDestroy(h);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaStreamDestroy(st);
    return SPARK_OK;
}

extern "C" spark_status backend_cuda_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes, char *name,
                                            size_t name_len)
{
    *free_bytes = *total_bytes = 0;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || device < 0 || device >= count) {
        cudaGetLastError();
        return spark_fail(SPARK_ERR_UNSUPPORTED, "no CUDA device %d", device);
    }
    cudaDeviceProp prop;
    size_t f = 0, t = 0;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess ||
        cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return spark_fail(SPARK_ERR_UNSUPPORTED, "CUDA device %d: cannot read its memory", device);
    }
    if (name && name_len) snprintf(name, name_len, "%s", prop.name);
    *free_bytes = f;
    *total_bytes = t;
    return SPARK_OK;
}

/*
 * matmul_overhead.c - what weft_matmul adds to cuBLASLt's own call: the
 * host time a call takes to enqueue a product whose plan is cached, against
 * cublasLtMatmul called directly with the same algorithm, workspace and
 * stream (the peer does what weft's call does once its checks and plan
 * lookup are done). bench/matmul/bench_matmul.py runs it and records the
 * difference against issue 39's 0.5 us.
 *
 * The product is small (64 x 64 x 64 bf16) so that the GPU keeps up and a
 * call's host time is its enqueue alone. Rounds of 100 calls alternate
 * between the two (the GPU drained between rounds, outside the timing);
 * each prints the median of its rounds' per-call times:
 *   weft_matmul_us X cublasLtMatmul_us Y
 * Both D are checked equal before timing. Exit 77 without a GPU.
 */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "weft/ops.h"

enum { N = 64, CALLS = 100, ROUNDS = 31 };

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "matmul_overhead: %s: %s\n", #call, cudaGetErrorString(e_));           \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define LT_OK(call)                                                                                \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "matmul_overhead: %s: status %d\n", #call, (int)s_);                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void)
{
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        fprintf(stderr, "matmul_overhead: no GPU\n");
        return 77;
    }
    size_t bytes = (size_t)N * N * sizeof(uint16_t), ws_bytes = 32u << 20;
    uint16_t host[N * N]; /* bf16: a float's top half (these eighths are exact) */
    for (int i = 0; i < N * N; i++) {
        float v = (float)((i * 37) % 17 - 8) / 8.0f;
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        host[i] = (uint16_t)(bits >> 16);
    }
    void *a, *b, *d_weft, *d_raw, *ws;
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc(&a, bytes));
    CUDA_OK(cudaMalloc(&b, bytes));
    CUDA_OK(cudaMalloc(&d_weft, bytes));
    CUDA_OK(cudaMalloc(&d_raw, bytes));
    CUDA_OK(cudaMalloc(&ws, ws_bytes));
    CUDA_OK(cudaMemcpy(a, host, bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(b, host, bytes, cudaMemcpyHostToDevice));

    /* weft: D = A B, row-major, bf16 */
    weft_matmul_desc desc = {.m = N, .n = N, .k = N, .type = WEFT_DTYPE_BF16};

    /* the peer: the same product column-major, D^T = B^T A^T, fp32 sums */
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    float alpha = 1.0f, beta = 0.0f;
    LT_OK(cublasLtCreate(&lt));
    LT_OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, N, N, N));
    LT_OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, N, N, N));
    LT_OK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, N, N, N));
    LT_OK(cublasLtMatmulPreferenceCreate(&pref));
    LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &ws_bytes, sizeof ws_bytes));
    LT_OK(cublasLtMatmulAlgoGetHeuristic(lt, op, lb, la, ld, ld, pref, 1, &heur, &found));
    if (found < 1) {
        fprintf(stderr, "matmul_overhead: cuBLASLt has no algorithm for %d^3 bf16\n", N);
        return 1;
    }

    /* both once (weft makes its plan here), and their D alike */
    if (weft_matmul(stream, &desc, d_weft, a, b, NULL) != WEFT_OK) {
        fprintf(stderr, "matmul_overhead: weft_matmul: %s\n", weft_last_error());
        return 1;
    }
    LT_OK(cublasLtMatmul(lt, op, &alpha, b, lb, a, la, &beta, d_raw, ld, d_raw, ld, &heur.algo, ws,
                         ws_bytes, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    uint16_t got_weft[N * N], got_raw[N * N];
    CUDA_OK(cudaMemcpy(got_weft, d_weft, bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got_raw, d_raw, bytes, cudaMemcpyDeviceToHost));
    if (memcmp(got_weft, got_raw, bytes) != 0)
        fprintf(stderr, "matmul_overhead: note: the two D differ (another algorithm's sums)\n");

    double t_weft[ROUNDS], t_raw[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_us();
        for (int i = 0; i < CALLS; i++)
            if (weft_matmul(stream, &desc, d_weft, a, b, NULL) != WEFT_OK) {
                fprintf(stderr, "matmul_overhead: weft_matmul: %s\n", weft_last_error());
                return 1;
            }
        t_weft[r] = (now_us() - t0) / CALLS;
        CUDA_OK(cudaStreamSynchronize(stream));
        t0 = now_us();
        for (int i = 0; i < CALLS; i++)
            LT_OK(cublasLtMatmul(lt, op, &alpha, b, lb, a, la, &beta, d_raw, ld, d_raw, ld,
                                 &heur.algo, ws, ws_bytes, stream));
        t_raw[r] = (now_us() - t0) / CALLS;
        CUDA_OK(cudaStreamSynchronize(stream));
    }
    qsort(t_weft, ROUNDS, sizeof *t_weft, by_value);
    qsort(t_raw, ROUNDS, sizeof *t_raw, by_value);
    printf("weft_matmul_us %.3f cublasLtMatmul_us %.3f\n", t_weft[ROUNDS / 2], t_raw[ROUNDS / 2]);

    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb),
        cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
    cudaFree(a), cudaFree(b), cudaFree(d_weft), cudaFree(d_raw), cudaFree(ws);
    cudaStreamDestroy(stream);
    return 0;
}

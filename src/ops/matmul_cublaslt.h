/*
 * matmul_cublaslt.h - what weft_matmul's two cuBLASLt files share, in CUDA
 * builds only: matmul_cublaslt.c keeps the handles, workspaces and plans
 * and launches a product in two steps (prepare, then launch), and
 * matmul_cublaslt_quant.c runs INT8's dequantized path on those steps.
 *
 * The split keeps the invariant of the whole: everything that can refuse
 * a call (the plan above all) runs in prepare, before anything is
 * enqueued.
 */
#ifndef WEFT_OPS_MATMUL_CUBLASLT_H
#define WEFT_OPS_MATMUL_CUBLASLT_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "ops/matmul.h"

/* A product ready to launch. The plan (layouts and algorithm) is
 * matmul_cublaslt.c's; cuBLASLt takes its layouts by non-const pointer
 * and reads them only. */
typedef struct weft__lt_ready {
    cublasLtHandle_t h;
    void *ws;
    size_t ws_size;
    cublasLtMatmulDescOpaque_t md;
    struct weft__lt_plan *p;
} weft__lt_ready;

/* The handle, the stream's workspace, the descriptor and the plan of a,
 * into *r: WEFT_OK, or the error (with its message) and nothing
 * enqueued. */
int weft__matmul_lt_prepare(cudaStream_t stream, const weft__matmul_args *a, weft__lt_ready *r);

/* Enqueues the prepared product of a, writing d rather than a->d. */
int weft__matmul_lt_launch(cudaStream_t stream, const weft__matmul_args *a, weft__lt_ready *r,
                           void *d);

/* A failed CUDA runtime call of weft_matmul's: cleared (a refused call is
 * not sticky) and reported through weft__fail. */
int weft__matmul_lt_cuda_fail(const char *what, cudaError_t e);

/* INT8 operands into a bf16, fp16 or fp32 D (matmul_cublaslt_quant.c). */
int weft__matmul_lt_dequantized(cudaStream_t stream, const weft__matmul_args *a);

#endif

/*
 * matmul_cublaslt_quant.c - weft_matmul's INT8 operands into a bf16, fp16
 * or fp32 D on the GPU: cuBLASLt's int8 GEMM, then weft's dequantizing
 * epilogue (matmul_quant.cu). An int32 D, and FP8, are plain cuBLASLt
 * products (matmul_cublaslt.c).
 *
 * cuBLASLt's int8 kernels end in int32 or int8 and apply no per-row and
 * per-column fp32 scales, so the exact int32 product goes into a buffer
 * taken from CUDA's stream-ordered pool (cudaMallocAsync), the epilogue
 * reads it once into D, and the buffer is freed in stream order right
 * after (cudaFreeAsync). The pool keeps the memory for the next call, no
 * stream waits on another's buffer, and a captured call records the
 * allocation as graph memory nodes. As for every matmul, what can refuse
 * the call (the plan) runs before anything is enqueued.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "core/error.h"
#include "ops/matmul.h"
#include "ops/matmul_cublaslt.h"

static const char OP[] = "weft_matmul";

/* INT8 into a bf16/fp16/fp32 D: the exact product into a pooled int32
 * buffer (rows of ldw, a multiple of 4 as cuBLASLt's int8 C asks), then
 * the dequantizing epilogue, then the buffer back to the pool. The plan is
 * made first, for a buffer at the pool's 256-byte alignment (cudaMalloc's),
 * so that a refusal comes before anything is enqueued. */
int weft__matmul_lt_dequantized(cudaStream_t stream, const weft__matmul_args *a)
{
    size_t ldw = (a->n + 3) / 4 * 4;
    if (a->m > SIZE_MAX / ldw / sizeof(int32_t) / a->batch)
        return weft__fail(WEFT_EINVAL, "%s: the int32 product is too large", OP);

    weft__matmul_args w = *a; /* the same operands, into the buffer, exactly */
    w.type = w.c_type = w.bias_type = WEFT_DTYPE_I32;
    w.d = NULL, w.ldd = ldw, w.stride_d = a->batch > 1 ? a->m * ldw : 0;
    w.c = NULL, w.bias = NULL, w.aux = NULL, w.act = WEFT_MATMUL_ACT_NONE;
    w.ldc = w.ldd, w.stride_c = w.stride_d, w.stride_aux = 0, w.ldaux = w.ldd;
    w.alpha = 1.0f, w.beta = 0.0f;
    w.scale_a_mode = w.scale_b_mode = WEFT_MATMUL_SCALE_NONE;
    w.scale_a = w.scale_b = NULL;
    weft__lt_ready r;
    int rc = weft__matmul_lt_prepare(stream, &w, &r);
    if (rc != WEFT_OK)
        return rc;

    void *acc = NULL;
    cudaError_t e = cudaMallocAsync(&acc, a->batch * a->m * ldw * sizeof(int32_t), stream);
    if (e != cudaSuccess)
        return weft__matmul_lt_cuda_fail("cudaMallocAsync (the int32 product)", e);
    if ((uintptr_t)acc % 256 != 0) /* the plan's assumption; never seen, but cheap to keep */
        rc = weft__fail(WEFT_EDEVICE, "%s: the pool's block is not 256-byte aligned", OP);
    else
        rc = weft__matmul_lt_launch(stream, &w, &r, acc);
    if (rc == WEFT_OK)
        rc = weft__matmul_dequant_cuda(stream, a, acc, ldw);
    /* Freed in stream order, after whatever was enqueued above. */
    if ((e = cudaFreeAsync(acc, stream)) != cudaSuccess && rc == WEFT_OK)
        rc = weft__matmul_lt_cuda_fail("cudaFreeAsync (the int32 product)", e);
    return rc;
}

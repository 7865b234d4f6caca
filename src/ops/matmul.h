/*
 * matmul.h - what weft_matmul's files share: the checked arguments, the
 * host reference (matmul_host.c on a BLAS, or matmul_no_blas.c in a build
 * without one) and the GPU paths (with CUDA only): cuBLASLt
 * (matmul_cublaslt.c; INT8 into a dequantized D in matmul_cublaslt_quant.c
 * with its epilogue's kernel in matmul_quant.cu; matmul_cublaslt.h is what
 * those two C files share) and, for decode's few bf16, fp16 or FP8 rows,
 * weft's own kernel (matmul_skinny.cu), chosen by weft__matmul_skinny_fits.
 *
 * matmul.c fills weft__matmul_args from the caller's descriptor with every
 * default resolved (leading dimensions, batch, alpha, beta, the operand
 * type), so the backends read plain values and never a zero that means
 * something else.
 */
#ifndef WEFT_OPS_MATMUL_H
#define WEFT_OPS_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "weft/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What kind of product: the operand types' family. */
typedef enum weft__matmul_kind {
    WEFT__MM_FLOAT = 0, /* fp32, bf16 or fp16 operands */
    WEFT__MM_FP8 = 1,   /* FP8 operands with scales */
    WEFT__MM_INT8 = 2   /* INT8 operands: an int32 D, or dequantized */
} weft__matmul_kind;

/* Checked and resolved; sizes in elements. in_type is A's, in_type_b B's
 * (the same but for FP8's mixed pairs); c_type is C's, bias_type the
 * bias's (type but where cuBLASLt's FP8 rules say otherwise). Scales:
 * scale_*_mode is WEFT_MATMUL_SCALE_NONE exactly when the pointer is NULL;
 * scale_d and amax_d are set with an fp8 D only. */
typedef struct weft__matmul_args {
    size_t m, n, k, batch;
    weft__matmul_kind kind;
    weft_dtype type, in_type, in_type_b, c_type, bias_type;
    weft_matmul_scale scale_a_mode, scale_b_mode;
    const float *scale_a, *scale_b, *scale_d;
    float *amax_d;
    int trans_a, trans_b, allow_tf32;
    int b_constant; /* desc's: B unchanged by the work before on the stream */
    weft_matmul_act act;
    size_t lda, ldb, ldc, ldd, ldaux;
    size_t stride_a, stride_b, stride_c, stride_d, stride_aux;
    float alpha, beta; /* beta 0 when there is no C */
    void *d, *aux;
    const void *a, *b, *c, *bias;
    void *host_ws; /* the host reference's panels (weft__matmul_host_prepare) */
} weft__matmul_args;

/* weft_matmul's checks of desc and the pointers, into x (the messages
 * name weft_matmul): weft_matmul_sparse's product is one of its. */
int weft__matmul_check(const weft_matmul_desc *desc, void *d, const void *a, const void *b,
                       const void *c, weft__matmul_args *x);
/* weft_matmul after its checks (x from weft__matmul_check, stream checked):
 * a task's stream order, the GPU, or the host reference. */
int weft__matmul_enqueue(void *stream, weft__matmul_args *x);

/* The host reference, in two steps so that its memory is taken (and can
 * fail) at the call, before anything is enqueued:
 * prepare allocates a->host_ws, or fails with WEFT_ENOMEM, or WEFT_EINVAL
 * in a build without a BLAS; run computes the product and frees it. */
int weft__matmul_host_prepare(const char *op, weft__matmul_args *a);
void weft__matmul_host_run(weft__matmul_args *a);
/* run without the free: computes with a->host_ws and keeps it, so that one
 * prepared workspace serves several products of the same operand type
 * (weft_grouped_matmul's groups); the caller frees it. */
void weft__matmul_host_compute(const weft__matmul_args *a);

/* GELU or ReLU of an epilogue's pre-activation, as the host computes it. */
float weft__matmul_act(weft_matmul_act act, float x);

/* Whether a GPU call goes to the skinny kernel (matmul_skinny.cu) rather
 * than cuBLASLt: 1 or 0. Plain C on the checked arguments, so that the
 * host suite tests the rule. */
int weft__matmul_skinny_fits(const weft__matmul_args *a);

#ifdef WEFT_HAVE_CUDA
/* Enqueues the product on stream (a cudaStream_t): through the skinny
 * kernel when weft__matmul_skinny_fits, else through cuBLASLt; the
 * arguments have been checked. WEFT_OK, or WEFT_EINVAL when cuBLASLt has
 * no algorithm for the call (the message names shape and types),
 * WEFT_ENOMEM when a workspace cannot be had, WEFT_EDEVICE for the rest,
 * each before anything is enqueued. */
int weft__matmul_cuda(void *stream, const weft__matmul_args *a);

/* Enqueues the dequantizing epilogue of an INT8 product (matmul_quant.cu):
 * D (and aux) := act(alpha float(acc) sa sb + beta C + bias) from acc, the
 * exact int32 product of every batch as batch x m rows of ldw, packed. */
int weft__matmul_dequant_cuda(void *stream, const weft__matmul_args *a, const int32_t *acc,
                              size_t ldw);

/* How many calls found their plan cached, and how many made one. */
void weft__matmul_cuda_plan_stats(unsigned long long *hits, unsigned long long *misses);

/* How many calls weft__matmul_cuda sent to the skinny kernel. */
unsigned long long weft__matmul_cuda_skinny_calls(void);

/* Enqueues the product on stream through the skinny kernel; the arguments
 * have been checked and weft__matmul_skinny_fits said yes. WEFT_OK, or the
 * launch's error with CUDA's name for it. */
int weft__matmul_skinny_cuda(void *stream, const weft__matmul_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif

/*
 * matmul.c - weft_matmul: its argument checks and the choice of backend.
 *
 * The fusion: a framework computes a Linear layer as a matmul, then a bias
 * add, then an activation (and a residual add), each a pass over the
 * output. Here the epilogue runs on the product while it is still in
 * registers: cuBLASLt's epilogues or the skinny kernel's on the GPU, the
 * tile just computed on the host. The erf GELU, which cuBLASLt lacks, is
 * the one exception: through cuBLASLt it is a second pass
 * (matmul_cublaslt.c).
 *
 * The GPU's two paths: decode's few rows (m <= 16) times a Linear weight
 * go to weft's own kernel (matmul_skinny.cu), which reads the weights once
 * for all the rows; everything else to cuBLASLt. weft__matmul_skinny_fits
 * is the whole rule.
 *
 * Every check runs here, before either backend sees the call, so a call
 * fails with WEFT_EINVAL and a reason or runs to the end, and a call valid
 * on the host is valid on the GPU (the GPU's own requirements - aux
 * leading dimensions of 8 - are asked on both). The resolved arguments
 * (matmul.h) carry no "zero means default" any more.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "ops/matmul.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_matmul";

float weft__matmul_act(weft_matmul_act act, float x)
{
    switch (act) {
    case WEFT_MATMUL_ACT_RELU:
        return x > 0.0f || isnan(x) ? x : 0.0f;
    case WEFT_MATMUL_ACT_GELU_TANH:
        return weft__gelu(WEFT_GELU_TANH, x);
    case WEFT_MATMUL_ACT_GELU_ERF:
        return weft__gelu(WEFT_GELU_ERF, x);
    default:
        return x;
    }
}

/* The operand types cuBLASLt multiplies with fp32 accumulation: fp32 by
 * fp32 into fp32, and a 16-bit type by itself into itself or fp32. */
static int check_types(weft_dtype type, weft_dtype in_type)
{
    int rc;
    if ((rc = weft__check_dtype(OP, type)) != WEFT_OK ||
        (rc = weft__check_dtype(OP, in_type)) != WEFT_OK)
        return rc;
    if (in_type != type && type != WEFT_DTYPE_F32)
        return weft__fail(WEFT_EINVAL,
                          "%s: operands of dtype %d need a D of their dtype or fp32, not %d", OP,
                          (int)in_type, (int)type);
    return WEFT_OK;
}

/* One batched matrix: rows x cols with leading dimension ld (0 = cols),
 * batch matrices stride apart (0 = shared, when shared is allowed); all of
 * it addressable. *ld_out gets the resolved leading dimension. */
static int check_matrix(const char *what, size_t rows, size_t cols, size_t ld, size_t batch,
                        size_t stride, int shared_ok, weft_dtype dtype, size_t *ld_out)
{
    size_t limit = SIZE_MAX / weft__dtype_size(dtype);
    int rc;

    if (ld == 0)
        ld = cols;
    if (ld < cols)
        return weft__fail(WEFT_EINVAL,
                          "%s: %s's leading dimension %zu is smaller than its row (%zu)", OP, what,
                          ld, cols);
    if ((rc = weft__check_rows(OP, what, rows, cols, ld, dtype)) != WEFT_OK)
        return rc;
    size_t extent = (rows - 1) * ld + cols;
    if (batch > 1) {
        if (stride == 0 && !shared_ok)
            return weft__fail(WEFT_EINVAL, "%s: %s's batch stride is 0: batches would overlap", OP,
                              what);
        if (stride != 0 && stride < extent && !shared_ok)
            return weft__fail(WEFT_EINVAL,
                              "%s: %s's batch stride %zu is smaller than its matrix (%zu)", OP,
                              what, stride, extent);
        if (stride > limit || (batch - 1) > (limit - extent) / (stride ? stride : 1))
            return weft__fail(WEFT_EINVAL, "%s: %s of %zu batches by stride %zu is too large", OP,
                              what, batch, stride);
    }
    *ld_out = ld;
    return WEFT_OK;
}

static int check_desc(const weft_matmul_desc *desc, void *d, const void *a, const void *b,
                      const void *c, weft__matmul_args *x)
{
    int rc;

    if (!desc)
        return weft__fail(WEFT_EINVAL, "%s: desc is NULL", OP);
    for (size_t i = 0; i < sizeof desc->reserved / sizeof desc->reserved[0]; i++)
        if (desc->reserved[i] != 0)
            return weft__fail(WEFT_EINVAL, "%s: desc->reserved[%zu] is not zero", OP, i);

    *x = (weft__matmul_args){0};
    x->m = desc->m, x->n = desc->n, x->k = desc->k;
    x->batch = desc->batch ? desc->batch : 1;
    x->type = desc->type;
    x->in_type = desc->in_type == WEFT_DTYPE_F32 ? desc->type : desc->in_type;
    x->trans_a = desc->trans_a != 0, x->trans_b = desc->trans_b != 0;
    x->allow_tf32 = desc->allow_tf32 != 0;
    x->act = desc->act;
    x->d = d, x->a = a, x->b = b, x->c = c;
    x->bias = desc->bias, x->aux = desc->aux;

    if ((rc = check_types(x->type, x->in_type)) != WEFT_OK)
        return rc;
    if (x->m == 0 || x->n == 0 || x->k == 0)
        return weft__fail(WEFT_EINVAL, "%s: m, n and k must be >= 1 (%zu x %zu x %zu)", OP, x->m,
                          x->n, x->k);
    if ((unsigned)x->act > WEFT_MATMUL_ACT_GELU_ERF)
        return weft__fail(WEFT_EINVAL, "%s: unknown activation %d", OP, (int)x->act);
    if (x->aux && x->act != WEFT_MATMUL_ACT_GELU_TANH && x->act != WEFT_MATMUL_ACT_GELU_ERF)
        return weft__fail(WEFT_EINVAL,
                          "%s: aux (the pre-activation) is kept for a GELU only; ReLU's gradient "
                          "reads from D",
                          OP);
    if (!isfinite(desc->alpha) || !isfinite(desc->beta))
        return weft__fail(WEFT_EINVAL, "%s: alpha and beta must be finite", OP);
    x->alpha = desc->alpha != 0.0f ? desc->alpha : 1.0f;
    x->beta = c ? (desc->beta != 0.0f ? desc->beta : 1.0f) : 0.0f;

    /* A is m x k (k x m transposed), B k x n (n x k transposed). */
    size_t a_rows = x->trans_a ? x->k : x->m, a_cols = x->trans_a ? x->m : x->k;
    size_t b_rows = x->trans_b ? x->n : x->k, b_cols = x->trans_b ? x->k : x->n;
    size_t bt = x->batch;
    if ((rc = check_matrix("A", a_rows, a_cols, desc->lda, bt, desc->stride_a, 1, x->in_type,
                           &x->lda)) != WEFT_OK ||
        (rc = check_matrix("B", b_rows, b_cols, desc->ldb, bt, desc->stride_b, 1, x->in_type,
                           &x->ldb)) != WEFT_OK ||
        (rc = check_matrix("D", x->m, x->n, desc->ldd, bt, desc->stride_d, 0, x->type, &x->ldd)) !=
            WEFT_OK)
        return rc;
    x->ldc = x->ldd, x->ldaux = x->ldd;
    if (c && (rc = check_matrix("C", x->m, x->n, desc->ldc, bt, desc->stride_c, 1, x->type,
                                &x->ldc)) != WEFT_OK)
        return rc;
    if (x->aux && (rc = check_matrix("aux", x->m, x->n, desc->ldaux, bt, desc->stride_aux, 0,
                                     x->type, &x->ldaux)) != WEFT_OK)
        return rc;
    if (bt > 1) {
        x->stride_a = desc->stride_a, x->stride_b = desc->stride_b;
        x->stride_c = c ? desc->stride_c : 0, x->stride_d = desc->stride_d;
        x->stride_aux = x->aux ? desc->stride_aux : 0;
    }
    if (x->aux && (x->ldaux % 8 != 0 || x->stride_aux % 8 != 0))
        return weft__fail(WEFT_EINVAL,
                          "%s: aux's leading dimension (%zu) and batch stride (%zu) must be "
                          "multiples of 8 (cuBLASLt's rule for the GELU input)",
                          OP, x->ldaux, x->stride_aux);

    if ((rc = weft__check_ptr(OP, "D", d, 0, x->type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "A", a, 0, x->in_type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "B", b, 0, x->in_type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "C", c, 1, x->type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "bias", x->bias, 1, x->type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "aux", x->aux, 1, x->type)) != WEFT_OK)
        return rc;
    /* In place: element (i, j) of C is read just before the same element of
     * D is written, which needs the two layouts to be one. */
    if (c == d && (x->ldc != x->ldd || x->stride_c != x->stride_d))
        return weft__fail(WEFT_EINVAL,
                          "%s: C is D (in place) but their leading dimensions or batch strides "
                          "differ",
                          OP);
    if (x->aux && (x->aux == d || x->aux == c || x->aux == a || x->aux == b))
        return weft__fail(WEFT_EINVAL, "%s: aux must be a buffer of its own", OP);
    return WEFT_OK;
}

/* The skinny kernel's reach. It multiplies 16-bit operands only, with A
 * as stored (m x k) and B a Linear weight (trans_b: n x k), each row read
 * in 16-byte loads: so A and B, their rows and their batch strides must
 * be 16-byte aligned (a single row's stride is never used: m = 1 with any
 * lda, n = 1 with any ldb). It keeps m's rows in one pass of mma tiles of
 * 16 (m <= 16) and runs a block per 16 columns per batch (the grid's
 * second dimension holds 65535 batches), or a cluster of up to 8 sharing
 * their columns' k: with few tiles and a k long past what 8 blocks take
 * quickly most SMs would idle where cuBLASLt splits k further, so a long
 * k needs enough tiles (128, about the SMs of one GPU) to go there. */
int weft__matmul_skinny_fits(const weft__matmul_args *a)
{
    size_t e = weft__dtype_size(a->in_type);
    size_t tiles = (a->n + 15) / 16;
    int aligned = ((uintptr_t)a->a | (uintptr_t)a->b) % 16 == 0 &&
                  (a->m == 1 || a->lda * e % 16 == 0) && (a->n == 1 || a->ldb * e % 16 == 0) &&
                  a->stride_a * e % 16 == 0 && a->stride_b * e % 16 == 0;
    return a->m <= 16 && (a->in_type == WEFT_DTYPE_BF16 || a->in_type == WEFT_DTYPE_F16) &&
           !a->trans_a && a->trans_b && aligned && a->batch <= 65535 && tiles <= 0x7fffffff &&
           (a->k <= 32768 || tiles * a->batch >= 128);
}

static void run_host(const void *args)
{
    weft__matmul_args x = *(const weft__matmul_args *)args;
    weft__matmul_host_run(&x);
}

/* WEFT_TASK_STREAM: the task's CUDA stream in *stream, or (host backend)
 * the host reference enqueued in the task's stream order. */
static int task_stream(void **stream, weft__matmul_args *x)
{
    void *s = NULL;
    int rc = weft_stream(&s);
    if (rc == WEFT_ENOTASK)
        return weft__fail(rc, "%s: WEFT_TASK_STREAM outside a task", OP);
    if (rc != WEFT_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", weft_last_error());
        return weft__fail(rc, "%s: the task's stream: %s", OP, why);
    }
    if (s) {
        *stream = s;
        return WEFT__ON_STREAM;
    }
    if ((rc = weft__matmul_host_prepare(OP, x)) != WEFT_OK)
        return rc;
    rc = weft__task_stream_op(OP, stream, run_host, x, sizeof *x);
    if (rc != WEFT_OK)
        free(x->host_ws); /* not enqueued: the panels are still ours */
    return rc;
}

int weft_matmul(void *stream, const weft_matmul_desc *desc, void *d, const void *a, const void *b,
                const void *c)
{
    weft__matmul_args x;
    int rc;

    if ((rc = check_desc(desc, d, a, b, c, &x)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    if (stream == WEFT_TASK_STREAM && (rc = task_stream(&stream, &x)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__matmul_cuda(stream, &x);
#endif
    if ((rc = weft__matmul_host_prepare(OP, &x)) != WEFT_OK)
        return rc;
    weft__matmul_host_run(&x);
    return WEFT_OK;
}

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
 * The GPU's two paths: decode's few rows (m <= 32) of bf16, fp16 or FP8
 * times a Linear weight go to weft's own kernel (matmul_skinny.cu), which
 * reads the weights once for all the rows; everything else, INT8 at any m
 * among it, to cuBLASLt. weft__matmul_skinny_fits is the whole rule.
 *
 * Every check runs here, before either backend sees the call, so a call
 * fails with WEFT_EINVAL and a reason or runs to the end, and a call valid
 * on the host is valid on the GPU (the GPU's own requirements - aux
 * leading dimensions of 8 - are asked on both). The resolved arguments
 * (matmul.h) carry no "zero means default" any more.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "ops/matmul.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_matmul";

/* The quantized fields were carved out of reserved[16], which followed
 * allow_tf32 at the next 8-byte boundary: the struct's size and every
 * earlier field's place are what they were. */
_Static_assert(offsetof(weft_matmul_desc, in_type_b) == offsetof(weft_matmul_desc, allow_tf32) + 4,
               "the quantized fields follow allow_tf32");
_Static_assert(offsetof(weft_matmul_desc, b_constant) + 8 == offsetof(weft_matmul_desc, reserved),
               "b_constant and reserved_int take the first reserved word");
_Static_assert(sizeof(weft_matmul_desc) ==
                   offsetof(weft_matmul_desc, allow_tf32) + 8 + 16 * sizeof(uint64_t),
               "weft_matmul_desc keeps its size");

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

static int is_float(weft_dtype t)
{
    return t == WEFT_DTYPE_F32 || t == WEFT_DTYPE_BF16 || t == WEFT_DTYPE_F16;
}

static int is_quant(weft_dtype t)
{
    return weft__is_f8(t) || t == WEFT_DTYPE_I8 || t == WEFT_DTYPE_I32;
}

static int any_quant_field(const weft_matmul_desc *d)
{
    return d->in_type_b || d->c_type || d->scale_a_mode || d->scale_b_mode || d->scale_a ||
           d->scale_b || d->scale_d || d->amax_d;
}

/* The operand types cuBLASLt multiplies with fp32 accumulation: fp32 by
 * fp32 into fp32, and a 16-bit type by itself into itself or fp32. */
static int check_float_types(const weft_matmul_desc *desc, weft__matmul_args *x)
{
    if (is_quant(x->type))
        return weft__fail(WEFT_EINVAL, "%s: a D of dtype %d needs FP8 or INT8 operands", OP,
                          (int)x->type);
    if (x->in_type != x->type && x->type != WEFT_DTYPE_F32)
        return weft__fail(WEFT_EINVAL,
                          "%s: operands of dtype %d need a D of their dtype or fp32, not %d", OP,
                          (int)x->in_type, (int)x->type);
    if (any_quant_field(desc))
        return weft__fail(WEFT_EINVAL,
                          "%s: in_type_b, c_type, scales and amax_d are for FP8 and INT8 operands "
                          "only",
                          OP);
    x->in_type_b = x->in_type;
    x->c_type = x->bias_type = x->type;
    return WEFT_OK;
}

/* The operands' scales: both given with a mode each, pointers aligned. */
static int check_scales(const weft_matmul_desc *desc, weft__matmul_args *x, const char *kind)
{
    int rc;
    if (desc->scale_a_mode == WEFT_MATMUL_SCALE_NONE ||
        desc->scale_b_mode == WEFT_MATMUL_SCALE_NONE || !desc->scale_a || !desc->scale_b)
        return weft__fail(WEFT_EINVAL,
                          "%s: %s operands need scale_a and scale_b, each with its mode (tensor "
                          "or outer)",
                          OP, kind);
    if ((unsigned)desc->scale_a_mode > WEFT_MATMUL_SCALE_OUTER ||
        (unsigned)desc->scale_b_mode > WEFT_MATMUL_SCALE_OUTER)
        return weft__fail(WEFT_EINVAL, "%s: unknown scale mode (%d, %d)", OP,
                          (int)desc->scale_a_mode, (int)desc->scale_b_mode);
    if ((rc = weft__check_ptr(OP, "scale_a", desc->scale_a, 0, WEFT_DTYPE_F32)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "scale_b", desc->scale_b, 0, WEFT_DTYPE_F32)) != WEFT_OK)
        return rc;
    x->scale_a_mode = desc->scale_a_mode, x->scale_b_mode = desc->scale_b_mode;
    x->scale_a = desc->scale_a, x->scale_b = desc->scale_b;
    return WEFT_OK;
}

/* FP8 by FP8, as cuBLASLt's table of FP8 types has it. */
static int check_fp8_types(const weft_matmul_desc *desc, weft__matmul_args *x)
{
    int rc;
    x->kind = WEFT__MM_FP8;
    x->in_type_b = desc->in_type_b ? desc->in_type_b : x->in_type;
    if (!weft__is_f8(x->in_type_b))
        return weft__fail(WEFT_EINVAL, "%s: FP8 A needs an FP8 B, not dtype %d", OP,
                          (int)x->in_type_b);
    int e5 = x->in_type == WEFT_DTYPE_F8_E5M2 || x->in_type_b == WEFT_DTYPE_F8_E5M2;
    if (x->in_type == WEFT_DTYPE_F8_E5M2 && x->in_type_b == WEFT_DTYPE_F8_E5M2)
        return weft__fail(WEFT_EINVAL,
                          "%s: E5M2 x E5M2 is not an FP8 pair cuBLASLt multiplies (one operand "
                          "must be E4M3)",
                          OP);
    int d8 = weft__is_f8(x->type);
    if (!is_float(x->type) && !d8)
        return weft__fail(WEFT_EINVAL, "%s: FP8 operands give a bf16, fp16, fp32 or fp8 D, not %d",
                          OP, (int)x->type);
    if (x->type == WEFT_DTYPE_F8_E5M2 && !e5)
        return weft__fail(WEFT_EINVAL,
                          "%s: an E5M2 D needs an E5M2 operand (E4M3 x E4M3 gives "
                          "E4M3)",
                          OP);
    if (d8) {
        x->c_type = desc->c_type ? desc->c_type : WEFT_DTYPE_BF16;
        if (x->c_type != WEFT_DTYPE_BF16 && x->c_type != WEFT_DTYPE_F16)
            return weft__fail(WEFT_EINVAL, "%s: with an fp8 D, c_type is bf16 or fp16, not %d", OP,
                              (int)x->c_type);
        x->bias_type = x->c_type;
    } else {
        if (desc->c_type)
            return weft__fail(WEFT_EINVAL, "%s: c_type is for an fp8 D only", OP);
        x->c_type = x->type;
        /* cuBLASLt's rule: an fp32 D from FP8 takes a bf16 bias. */
        x->bias_type = x->type == WEFT_DTYPE_F32 ? WEFT_DTYPE_BF16 : x->type;
    }
    if ((rc = check_scales(desc, x, "FP8")) != WEFT_OK)
        return rc;
    if (x->scale_a_mode != x->scale_b_mode)
        return weft__fail(WEFT_EINVAL,
                          "%s: FP8 scales are both per tensor or both outer (per row of A and "
                          "column of B), not one of each",
                          OP);
    if (d8 && x->scale_a_mode == WEFT_MATMUL_SCALE_OUTER)
        return weft__fail(WEFT_EINVAL,
                          "%s: outer (row and column) FP8 scales give a bf16, fp16 or fp32 D, "
                          "not an fp8 one",
                          OP);
    if (d8 && !desc->scale_d)
        return weft__fail(WEFT_EINVAL, "%s: an fp8 D needs scale_d", OP);
    if (!d8 && (desc->scale_d || desc->amax_d))
        return weft__fail(WEFT_EINVAL, "%s: scale_d and amax_d are for an fp8 D only", OP);
    if ((rc = weft__check_ptr(OP, "scale_d", desc->scale_d, 1, WEFT_DTYPE_F32)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "amax_d", desc->amax_d, 1, WEFT_DTYPE_F32)) != WEFT_OK)
        return rc;
    x->scale_d = desc->scale_d, x->amax_d = desc->amax_d;
    if (desc->aux)
        return weft__fail(WEFT_EINVAL, "%s: aux is not kept with FP8 operands", OP);
    if (d8 && desc->act == WEFT_MATMUL_ACT_GELU_ERF)
        return weft__fail(WEFT_EINVAL,
                          "%s: the erf GELU with an fp8 D is refused (it would run after D is "
                          "quantized); use the tanh GELU",
                          OP);
    return WEFT_OK;
}

/* INT8 by INT8: exact int32, or dequantized by scales. */
static int check_int8_types(const weft_matmul_desc *desc, const void *c, weft__matmul_args *x)
{
    x->kind = WEFT__MM_INT8;
    x->in_type_b = desc->in_type_b ? desc->in_type_b : x->in_type;
    if (x->in_type_b != WEFT_DTYPE_I8)
        return weft__fail(WEFT_EINVAL, "%s: INT8 A needs an INT8 B, not dtype %d", OP,
                          (int)x->in_type_b);
    if (desc->c_type || desc->scale_d || desc->amax_d)
        return weft__fail(WEFT_EINVAL, "%s: c_type, scale_d and amax_d are for an fp8 D only", OP);
    x->c_type = x->bias_type = x->type;
    if (x->type == WEFT_DTYPE_I32) {
        if (c || desc->bias || desc->aux || desc->act != WEFT_MATMUL_ACT_NONE ||
            (desc->alpha != 0.0f && desc->alpha != 1.0f) || desc->scale_a_mode ||
            desc->scale_b_mode || desc->scale_a || desc->scale_b)
            return weft__fail(WEFT_EINVAL,
                              "%s: an int32 D is the exact product: no alpha, C, bias, act, aux "
                              "or scales",
                              OP);
        return WEFT_OK;
    }
    if (!is_float(x->type))
        return weft__fail(WEFT_EINVAL,
                          "%s: INT8 operands give an int32, bf16, fp16 or fp32 D, "
                          "not %d",
                          OP, (int)x->type);
    return check_scales(desc, x, "dequantized INT8");
}

static int check_types(const weft_matmul_desc *desc, const void *c, weft__matmul_args *x)
{
    if (!is_float(x->type) && !is_quant(x->type))
        return weft__fail(WEFT_EINVAL, "%s: unsupported dtype %d", OP, (int)x->type);
    if (is_float(x->in_type))
        return check_float_types(desc, x);
    if (weft__is_f8(x->in_type))
        return check_fp8_types(desc, x);
    if (x->in_type == WEFT_DTYPE_I8)
        return check_int8_types(desc, c, x);
    if (x->in_type == WEFT_DTYPE_I32)
        return weft__fail(WEFT_EINVAL, "%s: int32 is D's type for INT8 operands, not an operand's",
                          OP);
    return weft__fail(WEFT_EINVAL, "%s: unsupported dtype %d", OP, (int)x->in_type);
}

/* cuBLASLt's FP8 kernels ask every matrix's dimensions, leading dimensions
 * and pointers to keep 16-byte alignment (its tensor-core rules, required
 * here): k (the operands' rows) in bytes, and for C and D their rows of n
 * (cuBLASLt's m), ld and batch stride in bytes, and their pointers. m is
 * free: it is cuBLASLt's n, the number of its columns. */
static int check_fp8_dims(const weft__matmul_args *x)
{
    size_t ed = weft__dtype_size(x->type), ec = weft__dtype_size(x->c_type);
    if (x->k % 16)
        return weft__fail(WEFT_EINVAL, "%s: FP8 needs k a multiple of 16, not %zu", OP, x->k);
    if ((x->n * ed) % 16 || (x->ldd * ed) % 16 || (x->stride_d * ed) % 16 || (uintptr_t)x->d % 16)
        return weft__fail(WEFT_EINVAL,
                          "%s: FP8 needs D's rows, ldd and stride_d multiples of 16 bytes and D "
                          "16-byte aligned (n %zu, ldd %zu, stride %zu of %zu-byte elements)",
                          OP, x->n, x->ldd, x->stride_d, ed);
    if (x->c &&
        ((x->n * ec) % 16 || (x->ldc * ec) % 16 || (x->stride_c * ec) % 16 || (uintptr_t)x->c % 16))
        return weft__fail(WEFT_EINVAL,
                          "%s: FP8 needs C's rows, ldc and stride_c multiples of 16 bytes and C "
                          "16-byte aligned (ldc %zu, stride %zu of %zu-byte elements)",
                          OP, x->ldc, x->stride_c, ec);
    return WEFT_OK;
}

/* cuBLASLt's FP8 and INT8 kernels take only its "TN" form (its A
 * transposed, its B not); through the transposition of
 * matmul_cublaslt.c that is our A as m x k rows (trans_a 0) and B as n x k
 * rows (trans_b 1). Leading dimensions and batch strides are multiples of
 * 16 bytes for FP8 and 4 for INT8 (n and k too), the operands aligned as
 * much. Asked on
 * both backends, so a call valid on one is valid on the other. */
static int check_quant_layout(const weft__matmul_args *x)
{
    const char *kind = x->kind == WEFT__MM_FP8 ? "FP8" : "INT8";
    size_t q = x->kind == WEFT__MM_FP8 ? 16 : 4;
    if (x->trans_a || !x->trans_b)
        return weft__fail(WEFT_EINVAL,
                          "%s: %s needs cuBLASLt's TN layout: A stored m x k (trans_a 0) and B "
                          "stored n x k (trans_b 1)",
                          OP, kind);
    if (x->lda % q || x->ldb % q || x->stride_a % q || x->stride_b % q)
        return weft__fail(WEFT_EINVAL,
                          "%s: %s needs lda, ldb and the batch strides of A and B to be "
                          "multiples of %zu (lda %zu, ldb %zu, strides %zu, %zu)",
                          OP, kind, q, x->lda, x->ldb, x->stride_a, x->stride_b);
    if ((uintptr_t)x->a % q || (uintptr_t)x->b % q)
        return weft__fail(WEFT_EINVAL, "%s: %s needs A and B aligned to %zu bytes", OP, kind, q);
    /* cuBLASLt's int8 kernels ask its m (our n) and k to be multiples of 4. */
    if (x->kind == WEFT__MM_INT8 && (x->n % 4 || x->k % 4))
        return weft__fail(WEFT_EINVAL,
                          "%s: INT8 needs n and k multiples of 4 (cuBLASLt's m and k), not n %zu, "
                          "k %zu",
                          OP, x->n, x->k);
    if (x->kind == WEFT__MM_INT8 && x->k > 131071)
        return weft__fail(WEFT_EINVAL,
                          "%s: INT8 needs k at most 131071 (so that no int32 sum overflows), not "
                          "%zu",
                          OP, x->k);
    if (x->type == WEFT_DTYPE_I32 && (x->ldd % 4 || x->stride_d % 4))
        return weft__fail(WEFT_EINVAL,
                          "%s: an int32 D needs ldd and stride_d multiples of 4 (ldd %zu, stride "
                          "%zu)",
                          OP, x->ldd, x->stride_d);
    if (x->kind == WEFT__MM_FP8)
        return check_fp8_dims(x);
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
    if (desc->reserved_int != 0)
        return weft__fail(WEFT_EINVAL, "%s: desc->reserved_int is not zero", OP);

    *x = (weft__matmul_args){0};
    x->m = desc->m, x->n = desc->n, x->k = desc->k;
    x->batch = desc->batch ? desc->batch : 1;
    x->type = desc->type;
    x->in_type = desc->in_type == WEFT_DTYPE_F32 ? desc->type : desc->in_type;
    x->trans_a = desc->trans_a != 0, x->trans_b = desc->trans_b != 0;
    x->allow_tf32 = desc->allow_tf32 != 0;
    x->b_constant = desc->b_constant != 0;
    x->act = desc->act;
    x->d = d, x->a = a, x->b = b, x->c = c;
    x->bias = desc->bias, x->aux = desc->aux;

    if ((rc = check_types(desc, c, x)) != WEFT_OK)
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
        (rc = check_matrix("B", b_rows, b_cols, desc->ldb, bt, desc->stride_b, 1, x->in_type_b,
                           &x->ldb)) != WEFT_OK ||
        (rc = check_matrix("D", x->m, x->n, desc->ldd, bt, desc->stride_d, 0, x->type, &x->ldd)) !=
            WEFT_OK)
        return rc;
    x->ldc = x->ldd, x->ldaux = x->ldd;
    if (c && (rc = check_matrix("C", x->m, x->n, desc->ldc, bt, desc->stride_c, 1, x->c_type,
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
        (rc = weft__check_ptr(OP, "B", b, 0, x->in_type_b)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "C", c, 1, x->c_type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "bias", x->bias, 1, x->bias_type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "aux", x->aux, 1, x->type)) != WEFT_OK)
        return rc;
    if (x->kind != WEFT__MM_FLOAT && (rc = check_quant_layout(x)) != WEFT_OK)
        return rc;
    if (c == d && x->c_type != x->type)
        return weft__fail(WEFT_EINVAL, "%s: C is D (in place) but their types differ", OP);
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

/* Whether the call is a plain 16/32-bit product: A and B of one such
 * type, D of theirs or fp32, C and bias of D's, no scales and no amax.
 * The skinny kernel reads its operands as in_type and its C, bias and D
 * as type, and scales nothing, so an FP8 or INT8 call (or an fp8 or int32
 * D) must never reach it; whatever check_desc lets through, this keeps
 * those on cuBLASLt's paths. */
static int plain_types(const weft__matmul_args *a)
{
    return a->kind == WEFT__MM_FLOAT && is_float(a->in_type) && a->in_type_b == a->in_type &&
           (a->type == a->in_type || a->type == WEFT_DTYPE_F32) && a->c_type == a->type &&
           a->bias_type == a->type && a->scale_a_mode == WEFT_MATMUL_SCALE_NONE &&
           a->scale_b_mode == WEFT_MATMUL_SCALE_NONE && !a->scale_a && !a->scale_b && !a->scale_d &&
           !a->amax_d;
}

/* The operand and epilogue types the skinny kernel multiplies: bf16 or
 * fp16 operands in a plain product (plain_types); or FP8 ones with their
 * scales (by tensor or by row and column) into a bf16, fp16 or fp32 D whose
 * C and bias are of its type (an fp32 D's bf16 bias, an fp8 D with its
 * scale and amax, go to cuBLASLt). */
static int skinny_types(const weft__matmul_args *a)
{
    if (a->kind == WEFT__MM_FLOAT)
        return (a->in_type == WEFT_DTYPE_BF16 || a->in_type == WEFT_DTYPE_F16) && plain_types(a);
    return a->kind == WEFT__MM_FP8 && is_float(a->type) && a->c_type == a->type &&
           (!a->bias || a->bias_type == a->type) && !a->scale_d && !a->amax_d;
}

/* The skinny kernel's reach: the types above, with A as stored (m x k) and
 * B a Linear weight (trans_b: n x k), each row read in 16-byte loads: so A
 * and B, their rows and their batch strides must be 16-byte aligned (a
 * single row's stride is never used: m = 1 with any lda, n = 1 with any
 * ldb). It keeps m's rows in one pass of mma tiles (m <= 32) and
 * runs a block per 16 columns per batch (the grid's second dimension
 * holds 65535 batches), or a cluster of up to 8 sharing their columns' k:
 * with few tiles and a k long past what 8 blocks take quickly most SMs
 * would idle where cuBLASLt splits k further, so a long k needs enough
 * tiles (128, about the SMs of one GPU) to go there. */
int weft__matmul_skinny_fits(const weft__matmul_args *a)
{
    size_t e = weft__dtype_size(a->in_type);
    size_t tiles = (a->n + 15) / 16;
    int aligned = ((uintptr_t)a->a | (uintptr_t)a->b) % 16 == 0 &&
                  (a->m == 1 || a->lda * e % 16 == 0) && (a->n == 1 || a->ldb * e % 16 == 0) &&
                  a->stride_a * e % 16 == 0 && a->stride_b * e % 16 == 0;
    return a->m <= 32 && skinny_types(a) && !a->trans_a && a->trans_b && aligned &&
           a->batch <= 65535 && tiles <= 0x7fffffff && (a->k <= 32768 || tiles * a->batch >= 128);
}

int weft__matmul_check(const weft_matmul_desc *desc, void *d, const void *a, const void *b,
                       const void *c, weft__matmul_args *x)
{
    return check_desc(desc, d, a, b, c, x);
}

static void run_host(const void *args)
{
    weft__matmul_args x = *(const weft__matmul_args *)args;
    weft__matmul_host_run(&x);
}

static int host_prepare(void *args)
{
    return weft__matmul_host_prepare(OP, args);
}

int weft__matmul_enqueue(void *stream, weft__matmul_args *x)
{
    int rc;

    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op_ws(OP, &stream, host_prepare, run_host, x, sizeof *x,
                                      &x->host_ws)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__matmul_cuda(stream, x);
#endif
    if ((rc = weft__matmul_host_prepare(OP, x)) != WEFT_OK)
        return rc;
    weft__matmul_host_run(x);
    return WEFT_OK;
}

int weft_matmul(void *stream, const weft_matmul_desc *desc, void *d, const void *a, const void *b,
                const void *c)
{
    weft__matmul_args x;
    int rc;

    if ((rc = check_desc(desc, d, a, b, c, &x)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    return weft__matmul_enqueue(stream, &x);
}

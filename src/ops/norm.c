/*
 * norm.c - LayerNorm and RMSNorm, each with an optional residual add in
 * front, and bias+GELU+residual+LayerNorm.
 *
 * The fusion: in a pre-norm transformer block a framework computes
 * s = x + residual (one kernel, s written), then normalizes s (a second
 * kernel reading s again). Here the sum is formed as the row is read, is
 * written once for the next block's residual, and is normalized without
 * another trip through memory; statistics, scale and shift are one kernel.
 *
 * Statistics: the mean first, then the deviations from it (two passes over
 * a row that a kernel holds in registers or shared memory), because the
 * one-pass E[s^2] - E[s]^2 cancels catastrophically for rows far from zero.
 * The second pass sums the deviations as well as their squares and uses
 * that sum to correct the mean and the variance (the corrected two-pass
 * algorithm of Chan, Golub and LeVeque): at mean 100 the first fp32 mean
 * is off by ~1e-5 of the standard deviation, the corrected one by ~1e-7.
 * Sums go through weft__sum (blocked fp32), close to the error of the
 * kernels' tree reductions.
 *
 * The normalized row is computed from s rounded to the dtype - the values
 * written to sum_out - so that out is exactly the normalization of what
 * the caller gets back as the sum.
 *
 * bias+GELU+residual+LayerNorm is the same row operation with another way
 * of forming s (GELU(in + gelu_bias) + residual, as gelu.c computes it):
 * one pass where a framework runs the GELU chain, writes x, and reads it
 * back to normalize. The kernels (norm.cu) share the row machinery too.
 *
 * RMSNorm into FP8 (weft_rmsnorm_fp8) is RMSNorm with weft_quantize_fp8
 * as its output: each normalized value is rounded to the dtype - what
 * weft_rmsnorm would store - and the row's largest magnitude, the scale
 * and the codes are taken from those values with quantize.h's helpers, so
 * that the bytes are the two calls' without the row between them ever
 * reaching memory.
 */
#include <math.h>

#include "core/error.h"
#include "ops/ops_internal.h"
#include "ops/quantize.h"

typedef weft__norm_args norm_args;

/* Element i (column j) of s, rounded as it is stored in sum_out. */
static float sum_at(const norm_args *a, size_t i, size_t j)
{
    float s = weft__load(a->dtype, a->in, i);
    if (a->gelu) {
        if (a->gelu_bias)
            s += weft__load(a->dtype, a->gelu_bias, j);
        s = weft__gelu(a->form, s);
        if (a->residual)
            s += weft__load(a->dtype, a->residual, i);
        return weft__round_to(a->dtype, s);
    }
    if (a->residual)
        s = weft__round_to(a->dtype, s + weft__load(a->dtype, a->residual, i));
    return s;
}

/* Column j's normalized value from its sum s, given mean (0 for RMSNorm)
 * and rstd, before it is rounded to the dtype. */
static float normalized(const norm_args *a, float s, size_t j, float mean, float rstd)
{
    float y = (s - mean) * rstd;
    if (a->weight)
        y *= weft__load(a->dtype, a->weight, j);
    if (a->bias)
        y += weft__load(a->dtype, a->bias, j);
    return y;
}

/* Writes row r of out from its sum, given mean (0 for RMSNorm) and rstd. */
static void write_row(const norm_args *a, size_t r, float mean, float rstd)
{
    size_t base = r * a->stride;

    for (size_t j = 0; j < a->cols; j++) {
        float s = sum_at(a, base + j, j);
        if (a->sum_out)
            weft__store(a->dtype, a->sum_out, base + j, s);
        weft__store(a->dtype, a->out, base + j, normalized(a, s, j, mean, rstd));
    }
}

/* Writes row r of an RMSNorm into FP8 (out, scales): the normalized row
 * rounded to the dtype, quantized as weft_quantize_fp8 quantizes it. Two
 * passes, as that op's, forming the same values in each; sum_out is
 * written in the second, as each element's last read of in and the
 * residual, which it may be. */
static void write_row_fp8(const norm_args *a, size_t r, float rstd)
{
    size_t base = r * a->stride;
    uint8_t *out = (uint8_t *)a->out + r * a->out_stride;
    float amax = 0.0f;

    for (size_t j = 0; j < a->cols; j++) {
        float y = normalized(a, sum_at(a, base + j, j), j, 0.0f, rstd);
        amax = fmaxf(amax, fabsf(weft__round_to(a->dtype, y)));
    }
    float scale = weft__fp8_scale(a->out_type, amax);
    for (size_t j = 0; j < a->cols; j++) {
        float s = sum_at(a, base + j, j);
        if (a->sum_out)
            weft__store(a->dtype, a->sum_out, base + j, s);
        float y = weft__round_to(a->dtype, normalized(a, s, j, 0.0f, rstd));
        out[j] = weft__fp8_code(a->out_type, y, scale);
    }
    a->scales[r] = scale;
}

static void host_layernorm(const norm_args *a)
{
    for (size_t r = 0; r < a->rows; r++) {
        size_t base = r * a->stride;
        weft__sum total = {0}, dev = {0}, dev2 = {0};
        for (size_t j = 0; j < a->cols; j++)
            weft__sum_add(&total, sum_at(a, base + j, j));
        float n = (float)a->cols, mean = weft__sum_get(&total) / n;
        for (size_t j = 0; j < a->cols; j++) {
            float d = sum_at(a, base + j, j) - mean;
            weft__sum_add(&dev, d);
            weft__sum_add(&dev2, d * d);
        }
        /* The deviations sum to n times the first mean's rounding error;
         * taking it out corrects both the mean and the variance. */
        float sd = weft__sum_get(&dev);
        mean += sd / n;
        float var = (weft__sum_get(&dev2) - sd * sd / n) / n;
        if (var < 0.0f) /* only by rounding, when every deviation is ~0 */
            var = 0.0f;
        /* A NaN or Inf in s makes mean or var NaN, and so the whole row. */
        write_row(a, r, mean, 1.0f / sqrtf(var + a->eps));
    }
}

static void host_rmsnorm(const norm_args *a)
{
    for (size_t r = 0; r < a->rows; r++) {
        size_t base = r * a->stride;
        weft__sum sq = {0};
        for (size_t j = 0; j < a->cols; j++) {
            float s = sum_at(a, base + j, j);
            weft__sum_add(&sq, s * s);
        }
        float ms = weft__sum_get(&sq) / (float)a->cols, rstd = 1.0f / sqrtf(ms + a->eps);
        if (a->fp8)
            write_row_fp8(a, r, rstd);
        else
            write_row(a, r, 0.0f, rstd);
    }
}

/* weft_rmsnorm_fp8's out and scales against every tensor it reads, sum_out
 * and each other: it reads a row's inputs in two passes, and other rows'
 * after writing its own, so no overlap is kept apart as the two calls it
 * stands for would keep it. */
static int check_fp8_overlaps(const char *op, const norm_args *a)
{
    const size_t es = weft__dtype_size(a->dtype);
    const struct {
        const char *name;
        const void *p;
        size_t rows, cols, stride, es;
    } t[] = {
        {"in", a->in, a->rows, a->cols, a->stride, es},
        {"residual", a->residual, a->rows, a->cols, a->stride, es},
        {"weight", a->weight, 1, a->cols, a->cols, es},
        {"sum_out", a->sum_out, a->rows, a->cols, a->stride, es},
        {"out", a->out, a->rows, a->cols, a->out_stride, 1},
        {"scales", a->scales, 1, a->rows, a->rows, sizeof(float)},
    };
    enum { OUT = 4, N = sizeof t / sizeof *t };

    for (size_t i = OUT; i < N; i++) {
        uintptr_t ilo, ihi, klo, khi;
        weft__extent(t[i].p, t[i].rows, t[i].cols, t[i].stride, t[i].es, &ilo, &ihi);
        for (size_t k = 0; k < i; k++) {
            if (!t[k].p)
                continue;
            weft__extent(t[k].p, t[k].rows, t[k].cols, t[k].stride, t[k].es, &klo, &khi);
            if (ilo < khi && klo < ihi)
                return weft__fail(WEFT_EINVAL, "%s: %s overlaps %s", op, t[i].name, t[k].name);
        }
    }
    return WEFT_OK;
}

static int check(const char *op, void *stream, const norm_args *a)
{
    int rc;

    if (a->fp8 && !weft__is_f8(a->out_type))
        return weft__fail(WEFT_EINVAL, "%s: out_type %d is not FP8 (WEFT_DTYPE_F8_E4M3 or _E5M2)",
                          op, (int)a->out_type);
    if ((rc = weft__check_dtype(op, a->dtype)) != WEFT_OK)
        return rc;
    if (a->gelu && a->form != WEFT_GELU_TANH && a->form != WEFT_GELU_ERF)
        return weft__fail(WEFT_EINVAL, "%s: unknown GELU form %d", op, (int)a->form);
    if (isnan(a->eps) || isinf(a->eps) || a->eps < 0)
        return weft__fail(WEFT_EINVAL, "%s: eps %g is not finite and >= 0", op, (double)a->eps);
    if ((rc = weft__check_rows(op, "the input", a->rows, a->cols, a->stride, a->dtype)) != WEFT_OK)
        return rc;
    if (a->fp8 && (rc = weft__check_rows(op, "the output", a->rows, a->cols, a->out_stride,
                                         a->out_type)) != WEFT_OK)
        return rc;
    if ((rc = weft__check_ptr(op, "out", a->out, 0, a->fp8 ? a->out_type : a->dtype)) != WEFT_OK ||
        (a->fp8 && (rc = weft__check_ptr(op, "scales", a->scales, 0, WEFT_DTYPE_F32)) != WEFT_OK) ||
        (rc = weft__check_ptr(op, a->gelu ? "x_out" : "sum_out", a->sum_out, 1, a->dtype)) !=
            WEFT_OK ||
        (rc = weft__check_ptr(op, "in", a->in, 0, a->dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(op, "gelu_bias", a->gelu_bias, 1, a->dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(op, "residual", a->residual, 1, a->dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(op, "weight", a->weight, 1, a->dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(op, "bias", a->bias, 1, a->dtype)) != WEFT_OK ||
        (rc = weft__check_stream(op, stream)) != WEFT_OK)
        return rc;
    return a->fp8 ? check_fp8_overlaps(op, a) : WEFT_OK;
}

/* The host reference of the call args describes. */
static void run_host(const void *args)
{
    const norm_args *a = args;
    if (a->rms)
        host_rmsnorm(a);
    else
        host_layernorm(a);
}

/* Checks, then runs on the stream (the task's, for WEFT_TASK_STREAM) or,
 * without one, on the host. */
static int run(const char *op, void *stream, const norm_args *a)
{
    int rc = check(op, stream, a);

    if (rc != WEFT_OK)
        return rc;
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(op, &stream, run_host, a, sizeof *a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__norm_cuda(stream, op, a);
#endif
    run_host(a);
    return WEFT_OK;
}

int weft_layernorm(void *stream, weft_dtype dtype, void *out, void *sum_out, const void *in,
                   const void *residual, const void *weight, const void *bias, float eps,
                   size_t rows, size_t cols, size_t stride)
{
    norm_args a = {.dtype = dtype,
                   .out = out,
                   .sum_out = sum_out,
                   .in = in,
                   .residual = residual,
                   .weight = weight,
                   .bias = bias,
                   .eps = eps,
                   .rows = rows,
                   .cols = cols,
                   .stride = stride};
    return run("weft_layernorm", stream, &a);
}

int weft_rmsnorm(void *stream, weft_dtype dtype, void *out, void *sum_out, const void *in,
                 const void *residual, const void *weight, float eps, size_t rows, size_t cols,
                 size_t stride)
{
    norm_args a = {.dtype = dtype,
                   .rms = 1,
                   .out = out,
                   .sum_out = sum_out,
                   .in = in,
                   .residual = residual,
                   .weight = weight,
                   .eps = eps,
                   .rows = rows,
                   .cols = cols,
                   .stride = stride};
    return run("weft_rmsnorm", stream, &a);
}

int weft_rmsnorm_fp8(void *stream, weft_dtype dtype, weft_dtype out_type, void *out, float *scales,
                     void *sum_out, const void *in, const void *residual, const void *weight,
                     float eps, size_t rows, size_t cols, size_t stride, size_t out_stride)
{
    norm_args a = {.dtype = dtype,
                   .rms = 1,
                   .fp8 = 1,
                   .out = out,
                   .sum_out = sum_out,
                   .in = in,
                   .residual = residual,
                   .weight = weight,
                   .eps = eps,
                   .rows = rows,
                   .cols = cols,
                   .stride = stride,
                   .out_type = out_type,
                   .scales = scales,
                   .out_stride = out_stride};
    return run("weft_rmsnorm_fp8", stream, &a);
}

int weft_bias_gelu_residual_layernorm(void *stream, weft_dtype dtype, weft_gelu_form form,
                                      void *out, void *x_out, const void *in, const void *gelu_bias,
                                      const void *residual, const void *weight, const void *bias,
                                      float eps, size_t rows, size_t cols, size_t stride)
{
    norm_args a = {.dtype = dtype,
                   .gelu = 1,
                   .form = form,
                   .out = out,
                   .sum_out = x_out,
                   .in = in,
                   .gelu_bias = gelu_bias,
                   .residual = residual,
                   .weight = weight,
                   .bias = bias,
                   .eps = eps,
                   .rows = rows,
                   .cols = cols,
                   .stride = stride};
    return run("weft_bias_gelu_residual_layernorm", stream, &a);
}

/*
 * softmax.c - softmax over the last dimension with scale, causal mask and
 * dropout in the same pass.
 *
 * The fusion: attention probabilities are usually scale(x), masked_fill,
 * softmax, dropout - four kernels and three intermediate score matrices.
 * Here a row is read once and its probabilities written once: the scale is
 * folded into the max and the exponent, masked columns are skipped (never
 * read, written as 0), and dropout regenerates its mask from Philox instead
 * of reading or storing one.
 *
 * Numerics: the row maximum is subtracted before exp, so no exponent
 * overflows and the largest term is exactly 1; the sum is fp32 in blocks
 * (weft__sum). The comparison "v > max" skips NaN, so a NaN reaches the
 * output through exp(NaN - max) and turns the whole row NaN, as documented.
 */
#include <math.h>

#include "core/error.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_softmax";

/* Columns [0, n) of row r are unmasked. */
static size_t visible(const weft__softmax_args *a, size_t r)
{
    if (a->o.causal_q == 0)
        return a->cols;
    return r % a->o.causal_q + a->cols - a->o.causal_q + 1;
}

static void host_softmax(const weft__softmax_args *a)
{
    float scale = a->o.scale, p = a->o.dropout_p;
    float keep_scale = 1.0f / (1.0f - p);

    for (size_t r = 0; r < a->rows; r++) {
        size_t base = r * a->stride, n = visible(a, r);
        float max = -INFINITY;
        for (size_t j = 0; j < n; j++) {
            float v = scale * weft__load(a->dtype, a->in, base + j);
            if (v > max)
                max = v;
        }
        weft__sum total = {0};
        for (size_t j = 0; j < n; j++)
            weft__sum_add(&total, weft__expf(scale * weft__load(a->dtype, a->in, base + j) - max));
        float sum = weft__sum_get(&total);
        for (size_t j = 0; j < a->cols; j++) {
            float y = 0.0f;
            if (j < n)
                y = weft__expf(scale * weft__load(a->dtype, a->in, base + j) - max) / sum;
            if (p > 0.0f)
                y = weft__dropout_keep(a->o.seed, a->o.offset, (uint64_t)r * a->cols + j, p)
                        ? y * keep_scale
                        : 0.0f;
            weft__store(a->dtype, a->out, base + j, y);
        }
    }
}

/* The host reference, as a host function in a task's stream order. */
static void run_host(const void *args)
{
    host_softmax(args);
}

int weft_softmax(void *stream, weft_dtype dtype, void *out, const void *in, size_t rows,
                 size_t cols, size_t stride, const weft_softmax_opts *opts)
{
    weft__softmax_args a = {dtype, out, in, rows, cols, stride, {.scale = 1.0f}};
    int rc;

    if (opts) {
        a.o = *opts;
        if (a.o.scale == 0.0f)
            a.o.scale = 1.0f;
    }
    if ((rc = weft__check_dtype(OP, dtype)) != WEFT_OK)
        return rc;
    if (isnan(a.o.scale) || isinf(a.o.scale))
        return weft__fail(WEFT_EINVAL, "%s: scale %g is not finite", OP, (double)a.o.scale);
    if (!(a.o.dropout_p >= 0.0f && a.o.dropout_p < 1.0f))
        return weft__fail(WEFT_EINVAL, "%s: dropout_p %g is not in [0, 1)", OP,
                          (double)a.o.dropout_p);
    if ((rc = weft__check_rows(OP, "the input", rows, cols, stride, dtype)) != WEFT_OK)
        return rc;
    if (a.o.causal_q > cols)
        return weft__fail(WEFT_EINVAL, "%s: causal_q %zu is more than the %zu columns", OP,
                          a.o.causal_q, cols);
    if ((rc = weft__check_ptr(OP, "out", out, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "in", in, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(OP, &stream, run_host, &a, sizeof a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__softmax_cuda(stream, &a);
#endif
    host_softmax(&a);
    return WEFT_OK;
}

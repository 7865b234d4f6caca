/*
 * gelu.c - bias + GELU + residual add, in one pass.
 *
 * The fusion: a framework runs h = x + bias, g = GELU(h), y = g + residual
 * as three kernels, writing h and g to memory and reading them back. Here
 * each element is read once (x, its bias, its residual) and written once
 * (y); h and g live in registers. Both GELU forms are offered, since models
 * are trained with one or the other and switching changes their outputs.
 *
 * This file holds the argument checks and the host reference; the host
 * reference is what a NULL stream runs and what the kernels (gelu.cu) are
 * tested against.
 */
#include "core/error.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_bias_gelu_residual";

static void host_bias_gelu_residual(const weft__gelu_args *a)
{
    for (size_t r = 0; r < a->rows; r++) {
        for (size_t j = 0; j < a->cols; j++) {
            size_t i = r * a->stride + j;
            float h = weft__load(a->dtype, a->in, i);
            if (a->bias)
                h += weft__load(a->dtype, a->bias, j);
            float y = weft__gelu(a->form, h);
            if (a->residual)
                y += weft__load(a->dtype, a->residual, i);
            weft__store(a->dtype, a->out, i, y);
        }
    }
}

/* The host reference, as a host function in a task's stream order. */
static void run_host(const void *args)
{
    host_bias_gelu_residual(args);
}

int weft_bias_gelu_residual(void *stream, weft_dtype dtype, weft_gelu_form form, void *out,
                            const void *in, const void *bias, const void *residual, size_t rows,
                            size_t cols, size_t stride)
{
    weft__gelu_args a = {dtype, form, out, in, bias, residual, rows, cols, stride};
    int rc;

    if ((rc = weft__check_dtype(OP, dtype)) != WEFT_OK)
        return rc;
    if (form != WEFT_GELU_TANH && form != WEFT_GELU_ERF)
        return weft__fail(WEFT_EINVAL, "%s: unknown GELU form %d", OP, (int)form);
    if ((rc = weft__check_rows(OP, "the input", rows, cols, stride, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "out", out, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "in", in, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "bias", bias, 1, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "residual", residual, 1, dtype)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(OP, &stream, run_host, &a, sizeof a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__gelu_cuda(stream, &a);
#endif
    host_bias_gelu_residual(&a);
    return WEFT_OK;
}

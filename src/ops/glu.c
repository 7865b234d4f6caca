/*
 * glu.c - gated linear units: SwiGLU and GeGLU.
 *
 * The fusion: the up-projection produces [a | b] in one row; a framework
 * slices it, runs the activation on a into a temporary, then multiplies by
 * b. Here each pair (a[j], b[j]) is read once and act(a[j]) * b[j] written
 * once, so the activated half never reaches memory.
 *
 * This file holds the argument checks and the host reference; glu.cu the
 * kernel.
 */
#include "core/error.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_glu";

static float activate(weft_glu_kind kind, float a)
{
    switch (kind) {
    case WEFT_GLU_GEGLU:
        return weft__gelu(WEFT_GELU_ERF, a);
    case WEFT_GLU_GEGLU_TANH:
        return weft__gelu(WEFT_GELU_TANH, a);
    default:
        return weft__silu(a);
    }
}

static void host_glu(const weft__glu_args *g)
{
    for (size_t r = 0; r < g->rows; r++) {
        size_t a0 = r * g->in_stride, b0 = a0 + g->cols, o0 = r * g->out_stride;
        for (size_t j = 0; j < g->cols; j++) {
            float a = weft__load(g->dtype, g->in, a0 + j), b = weft__load(g->dtype, g->in, b0 + j);
            weft__store(g->dtype, g->out, o0 + j, activate(g->kind, a) * b);
        }
    }
}

/* The host reference, as a host function in a task's stream order. */
static void run_host(const void *args)
{
    host_glu(args);
}

int weft_glu(void *stream, weft_dtype dtype, weft_glu_kind kind, void *out, const void *in,
             size_t rows, size_t cols, size_t in_stride, size_t out_stride)
{
    weft__glu_args g = {dtype, kind, out, in, rows, cols, in_stride, out_stride};
    int rc;

    if ((rc = weft__check_dtype(OP, dtype)) != WEFT_OK)
        return rc;
    if (kind != WEFT_GLU_SWIGLU && kind != WEFT_GLU_GEGLU && kind != WEFT_GLU_GEGLU_TANH)
        return weft__fail(WEFT_EINVAL, "%s: unknown kind %d", OP, (int)kind);
    if (cols > SIZE_MAX / 2)
        return weft__fail(WEFT_EINVAL, "%s: %zu columns is too many", OP, cols);
    if ((rc = weft__check_rows(OP, "the input", rows, 2 * cols, in_stride, dtype)) != WEFT_OK ||
        (rc = weft__check_rows(OP, "the output", rows, cols, out_stride, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "out", out, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "in", in, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(OP, &stream, run_host, &g, sizeof g)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__glu_cuda(stream, &g);
#endif
    host_glu(&g);
    return WEFT_OK;
}

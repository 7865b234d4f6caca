/*
 * quantize.c - weft_quantize_fp8: rows of fp32, bf16 or fp16 as FP8 with
 * a scale a row, what weft_matmul's FP8 product takes with per-row and
 * per-column scales. The checks and the host reference; quantize.cu is the
 * kernel. Both take the row's largest magnitude (a maximum: the same in any
 * order), divide by it over F in IEEE fp32 and round with the same
 * saturating conversion, so both write the same bytes.
 */
#include "ops/quantize.h"

#include <math.h>

#include "core/error.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_quantize_fp8";

static void host_quantize(const weft__quantize_args *a)
{
    uint8_t *out = a->out;
    for (size_t r = 0; r < a->rows; r++) {
        float amax = 0.0f;
        for (size_t j = 0; j < a->cols; j++)
            amax = fmaxf(amax, fabsf(weft__load(a->in_type, a->in, r * a->in_stride + j)));
        float scale = weft__fp8_scale(a->out_type, amax);
        for (size_t j = 0; j < a->cols; j++)
            out[r * a->out_stride + j] = weft__fp8_code(
                a->out_type, weft__load(a->in_type, a->in, r * a->in_stride + j), scale);
        a->scales[r] = scale;
    }
}

/* The host reference, as a host function in a task's stream order. */
static void run_host(const void *args)
{
    host_quantize(args);
}

int weft_quantize_fp8(void *stream, weft_dtype out_type, void *out, float *scales,
                      weft_dtype in_type, const void *in, size_t rows, size_t cols,
                      size_t in_stride, size_t out_stride)
{
    weft__quantize_args a = {out_type, in_type, out, scales, in, rows, cols, in_stride, out_stride};
    int rc;
    uintptr_t ilo, ihi, olo, ohi;

    if (!weft__is_f8(out_type))
        return weft__fail(WEFT_EINVAL, "%s: out_type %d is not FP8 (WEFT_DTYPE_F8_E4M3 or _E5M2)",
                          OP, (int)out_type);
    if ((rc = weft__check_dtype(OP, in_type)) != WEFT_OK ||
        (rc = weft__check_rows(OP, "the input", rows, cols, in_stride, in_type)) != WEFT_OK ||
        (rc = weft__check_rows(OP, "the output", rows, cols, out_stride, out_type)) != WEFT_OK)
        return rc;
    if (rows > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: %zu rows; at most %d", OP, rows, INT32_MAX);
    if ((rc = weft__check_ptr(OP, "out", out, 0, out_type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "scales", scales, 0, WEFT_DTYPE_F32)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "in", in, 0, in_type)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    weft__extent(in, rows, cols, in_stride, weft__dtype_size(in_type), &ilo, &ihi);
    weft__extent(out, rows, cols, out_stride, 1, &olo, &ohi);
    if (olo < ihi && ilo < ohi)
        return weft__fail(WEFT_EINVAL, "%s: out overlaps in", OP);
    if ((uintptr_t)scales < ihi && ilo < (uintptr_t)(scales + rows))
        return weft__fail(WEFT_EINVAL, "%s: scales overlaps in", OP);
    if ((uintptr_t)scales < ohi && olo < (uintptr_t)(scales + rows))
        return weft__fail(WEFT_EINVAL, "%s: scales overlaps out", OP);
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(OP, &stream, run_host, &a, sizeof a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__quantize_cuda(stream, &a);
#endif
    host_quantize(&a);
    return WEFT_OK;
}

/*
 * argmax.c - weft_argmax: the index of each row's largest element, the
 * choice of greedy decoding. On the GPU it saves a decode step the copy of
 * its logits to the host (a vocabulary of floats a row) and the host's walk
 * over them: the step copies back one int32 a row.
 *
 * The order is rank.h's, on both sides: equal values go to the lower index,
 * NaN ranks below every number, so the host and the GPU agree exactly.
 */
#include "ops/argmax.h"

#include "core/error.h"
#include "ops/ops_internal.h"
#include "ops/rank.h"

static const char OP[] = "weft_argmax";

static void host_argmax(const weft__argmax_args *a)
{
    for (size_t r = 0; r < a->rows; r++) {
        uint64_t best = 0;
        for (size_t j = 0; j < a->cols; j++) {
            uint64_t k = weft__rank(weft__f32_bits(weft__load(a->dtype, a->in, r * a->stride + j)),
                                    (uint32_t)j);
            if (k > best)
                best = k;
        }
        a->ids[r] = (int32_t)weft__rank_index(best);
    }
}

/* The host reference, as a host function in a task's stream order. */
static void run_host(const void *args)
{
    host_argmax(args);
}

int weft_argmax(void *stream, weft_dtype dtype, int32_t *ids, const void *in, size_t rows,
                size_t cols, size_t stride)
{
    weft__argmax_args a = {dtype, ids, in, rows, cols, stride};
    int rc;

    if ((rc = weft__check_dtype(OP, dtype)) != WEFT_OK ||
        (rc = weft__check_rows(OP, "the input", rows, cols, stride, dtype)) != WEFT_OK)
        return rc;
    if (cols > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: %zu columns; an int32 id reaches %d", OP, cols,
                          INT32_MAX);
    if (rows > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: %zu rows; at most %d", OP, rows, INT32_MAX);
    if ((rc = weft__check_ptr(OP, "ids", ids, 0, WEFT_DTYPE_I32)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "in", in, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(OP, &stream, run_host, &a, sizeof a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__argmax_cuda(stream, &a);
#endif
    host_argmax(&a);
    return WEFT_OK;
}

/*
 * penalize.c - weft_penalize: repetition, frequency and presence penalties
 * and logit biases applied in place to rows of logits before a draw, so
 * that a penalised generation draws on the device like any other instead
 * of bringing its vocabulary of logits to the host every token. The
 * checks and the host reference; the kernel is penalize.cu. Both adjust a
 * logit by penalize.h's one function, so they agree to the bit.
 */
#include "ops/penalize.h"

#include "core/error.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_penalize";

static void host_penalize(const weft__penalize_args *a)
{
    for (size_t r = 0; r < a->rows; r++) {
        const weft_penalties *p = &a->params[r];
        for (uint32_t i = 0; i < p->count; i++) {
            const weft_logit_adjust *adj = &a->adjust[(size_t)p->first + i];
            if (adj->token < 0 || (size_t)adj->token >= a->cols)
                continue;
            size_t at = r * a->stride + (size_t)adj->token;
            weft__store(a->dtype, a->logits, at,
                        weft__penalized(weft__load(a->dtype, a->logits, at), p, adj));
        }
    }
}

/* The host reference, as a host function in a task's stream order. */
static void run_host(const void *args)
{
    host_penalize(args);
}

int weft_penalize(void *stream, weft_dtype dtype, void *logits, size_t rows, size_t cols,
                  size_t stride, const weft_penalties *params, const weft_logit_adjust *adjust)
{
    weft__penalize_args a = {dtype, logits, rows, cols, stride, params, adjust};
    int rc;

    if ((rc = weft__check_dtype(OP, dtype)) != WEFT_OK ||
        (rc = weft__check_rows(OP, "the logits", rows, cols, stride, dtype)) != WEFT_OK)
        return rc;
    if (cols > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: %zu columns; an int32 token reaches %d", OP, cols,
                          INT32_MAX);
    if (rows > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: %zu rows; at most %d", OP, rows, INT32_MAX);
    if ((rc = weft__check_ptr(OP, "logits", logits, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    if (!params)
        return weft__fail(WEFT_EINVAL, "%s: params is NULL", OP);
    if ((uintptr_t)params % _Alignof(weft_penalties) != 0 ||
        (adjust && (uintptr_t)adjust % _Alignof(weft_logit_adjust) != 0))
        return weft__fail(WEFT_EINVAL, "%s: params or adjust is not aligned to its entries", OP);
    if (!adjust) /* no adjustments at all: only rows of count 0 may come */
        return weft__fail(WEFT_EINVAL, "%s: adjust is NULL", OP);
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(OP, &stream, run_host, &a, sizeof a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__penalize_cuda(stream, &a);
#endif
    host_penalize(&a);
    return WEFT_OK;
}

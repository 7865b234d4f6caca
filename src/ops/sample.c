/*
 * sample.c - weft_sample: the next token of each row drawn at a
 * temperature from its top-k and top-p tokens, with a seeded Philox draw,
 * so that a sampled generation needs no logits on the host and one seed
 * gives one text. The checks and the host reference, which sorts each row
 * by rank.h's order and walks it; the kernel (sample.cu) finds the same
 * places in that order without sorting.
 *
 * Weights are integers (sample.h), so the totals that decide where top-p
 * stops and where the draw lands do not depend on the order of the sums:
 * a GPU that adds in another order gives the same token.
 */
#include "ops/sample.h"

#include <stdlib.h>

#include "core/error.h"
#include "ops/ops_internal.h"
#include "ops/rank.h"

static const char OP[] = "weft_sample";

typedef struct ranked {
    uint64_t rank, weight;
} ranked;

static int by_rank_descending(const void *x, const void *y)
{
    uint64_t a = ((const ranked *)x)->rank, b = ((const ranked *)y)->rank;
    return a < b ? 1 : a > b ? -1 : 0;
}

static uint64_t draw_uniform(const weft_sampling *p)
{
    uint32_t ctr[4] = {WEFT__SAMPLE_SALT, 0, (uint32_t)p->offset, (uint32_t)(p->offset >> 32)};
    uint32_t key[2] = {(uint32_t)p->seed, (uint32_t)(p->seed >> 32)}, word[4];
    weft__philox4x32_10(ctr, key, word);
    return (uint64_t)word[1] << 32 | word[0];
}

static int32_t host_row(const weft__sample_args *a, size_t r, ranked *c)
{
    const weft_sampling *p = &a->params[r];
    size_t base = r * a->stride, n = a->cols;
    uint64_t best = 0;

    for (size_t j = 0; j < n; j++) {
        float l = weft__load(a->dtype, a->logits, base + j);
        c[j].rank = weft__rank(weft__f32_bits(l), (uint32_t)j);
        best = c[j].rank > best ? c[j].rank : best;
    }
    uint32_t top = weft__rank_index(best);
    float l_max = weft__load(a->dtype, a->logits, base + top);
    if (!weft__sample_draws(p->temperature, l_max))
        return (int32_t)top;
    for (size_t j = 0; j < n; j++)
        c[j].weight =
            weft__sample_weight(weft__load(a->dtype, a->logits, base + j), l_max, p->temperature);
    qsort(c, n, sizeof *c, by_rank_descending);

    if (p->top_k > 0 && (size_t)p->top_k < n)
        n = (size_t)p->top_k;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += c[i].weight;
    uint64_t goal = weft__sample_goal(total, p->top_p), sum = 0;
    for (size_t i = 0; i < n && sum < goal; i++)
        if ((sum += c[i].weight) >= goal)
            n = i + 1;
    uint64_t at = weft__sample_scale(draw_uniform(p), sum); /* sum: the kept weight */
    sum = 0;
    for (size_t i = 0; i < n; i++)
        if ((sum += c[i].weight) > at)
            return (int32_t)weft__rank_index(c[i].rank);
    return (int32_t)top; /* not reached: at < the kept weight */
}

static void host_run(const weft__sample_args *a)
{
    for (size_t r = 0; r < a->rows; r++)
        a->ids[r] = host_row(a, r, a->host_ws);
}

/* The host reference in a task's stream order: the workspace is its to free. */
static void run_host(const void *args)
{
    const weft__sample_args *a = args;
    host_run(a);
    free(a->host_ws);
}

static int host_prepare(void *args)
{
    weft__sample_args *a = args;
    a->host_ws = malloc(a->cols * sizeof(ranked));
    return a->host_ws ? WEFT_OK
                      : weft__fail(WEFT_ENOMEM, "%s: no memory to rank %zu logits", OP, a->cols);
}

int weft_sample(void *stream, weft_dtype dtype, int32_t *ids, const void *logits, size_t rows,
                size_t cols, size_t stride, const weft_sampling *params)
{
    weft__sample_args a = {dtype, ids, logits, rows, cols, stride, params, NULL};
    int rc;

    if ((rc = weft__check_dtype(OP, dtype)) != WEFT_OK ||
        (rc = weft__check_rows(OP, "the logits", rows, cols, stride, dtype)) != WEFT_OK)
        return rc;
    if (cols > WEFT__SAMPLE_MAX_COLS)
        return weft__fail(WEFT_EINVAL, "%s: %zu columns; at most %u, so that sums of weights fit",
                          OP, cols, WEFT__SAMPLE_MAX_COLS);
    if (rows > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: %zu rows; at most %d", OP, rows, INT32_MAX);
    if ((rc = weft__check_ptr(OP, "ids", ids, 0, WEFT_DTYPE_I32)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "logits", logits, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    if (!params)
        return weft__fail(WEFT_EINVAL, "%s: params is NULL", OP);
    if ((uintptr_t)params % _Alignof(weft_sampling) != 0)
        return weft__fail(WEFT_EINVAL, "%s: params is not aligned to its %zu-byte entries", OP,
                          _Alignof(weft_sampling));
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op_ws(OP, &stream, host_prepare, run_host, &a, sizeof a,
                                      &a.host_ws)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__sample_cuda(stream, &a);
#endif
    if ((rc = host_prepare(&a)) != WEFT_OK)
        return rc;
    host_run(&a);
    free(a.host_ws);
    return WEFT_OK;
}

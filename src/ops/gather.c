/*
 * gather.c - weft_gather_rows: rows of a table picked by ids held in the
 * backend's memory, an embedding lookup. A decode step reads its tokens'
 * embeddings this way from ids it copied in, so the step's work is the
 * same whatever the tokens are (one graph, nothing in it to update); a
 * copy a row would name each token's row in its arguments.
 *
 * The ids are read when the copy runs, on the GPU where nothing can be
 * refused any more: an id outside the table gives a row of zeros, on both
 * sides, never a read outside it.
 */
#include "ops/gather.h"

#include <string.h>

#include "core/error.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_gather_rows";

static void host_gather(const weft__gather_args *a)
{
    size_t es = weft__dtype_size(a->dtype);
    for (size_t r = 0; r < a->rows; r++) {
        char *dst = (char *)a->out + r * a->out_stride * es;
        int32_t id = a->ids[r];
        if (id >= 0 && (size_t)id < a->table_rows)
            memcpy(dst, (const char *)a->table + (size_t)id * a->table_stride * es, a->cols * es);
        else
            memset(dst, 0, a->cols * es);
    }
}

/* The host reference, as a host function in a task's stream order. */
static void run_host(const void *args)
{
    host_gather(args);
}

int weft_gather_rows(void *stream, weft_dtype dtype, void *out, const void *table,
                     const int32_t *ids, size_t rows, size_t cols, size_t table_rows,
                     size_t table_stride, size_t out_stride)
{
    weft__gather_args a = {dtype, out,        table,        ids,       rows,
                           cols,  table_rows, table_stride, out_stride};
    int rc;

    if ((rc = weft__check_dtype(OP, dtype)) != WEFT_OK ||
        (rc = weft__check_rows(OP, "the table", table_rows, cols, table_stride, dtype)) !=
            WEFT_OK ||
        (rc = weft__check_rows(OP, "out", rows, cols, out_stride, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "out", out, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "table", table, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "ids", ids, 0, WEFT_DTYPE_I32)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    if (rows > INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: %zu rows; at most %d", OP, rows, INT32_MAX);
    size_t es = weft__dtype_size(dtype);
    const char *o = out, *t = table;
    size_t out_bytes = ((rows - 1) * out_stride + cols) * es;
    size_t table_bytes = ((table_rows - 1) * table_stride + cols) * es;
    if (o < t + table_bytes && t < o + out_bytes)
        return weft__fail(WEFT_EINVAL, "%s: out overlaps the table", OP);
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op(OP, &stream, run_host, &a, sizeof a)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__gather_rows_cuda(stream, &a);
#endif
    host_gather(&a);
    return WEFT_OK;
}

/*
 * grouped_matmul.c - weft_grouped_matmul: its argument checks and host
 * reference. grouped_matmul.cu holds the kernel.
 *
 * The experts of a mixture-of-experts layer each multiply their own rows
 * (a run of X in weft_moe_gate's expert order) by their own weight. The
 * group sizes live on the device, written there by the router, so the
 * call takes them as a device table and never asks the host to know them:
 * the kernel reads offsets itself, and a whole MoE layer can run and be
 * captured without a copy back.
 *
 * The host reference is weft_matmul's, one product per group (X_g W_g^T
 * plus the group's bias row, then act), on one workspace prepared at the
 * call, so the call fails before it writes or not at all. Called with a
 * NULL stream it checks the table and refuses a bad one; in a task's
 * stream order the table is read when the op runs, too late to refuse, so
 * there it is clamped as the kernel clamps it.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "ops/matmul.h"
#include "ops/moe.h"
#include "ops/ops_internal.h"

static const char OP[] = "weft_grouped_matmul";

static size_t clamp_row(int32_t v, size_t rows)
{
    if (v < 0)
        return 0;
    return (size_t)v < rows ? (size_t)v : rows;
}

/* weft_matmul's resolved arguments for rows of one group: X, W, Y and
 * the bias all of the call's 16-bit type (B's, C's and the bias's types
 * are resolved fields too, not zeros meaning "as A"), a plain product with
 * no scales (the quantized fields' zeros are "none"). */
static weft__matmul_args matmul_args(const weft__grouped_matmul_args *a, size_t rows)
{
    weft__matmul_args m = {0};
    m.m = rows, m.n = a->n, m.k = a->k, m.batch = 1;
    m.kind = WEFT__MM_FLOAT;
    m.type = m.in_type = m.in_type_b = m.c_type = m.bias_type = a->type;
    m.trans_b = 1;
    m.act = a->act;
    m.lda = a->ldx, m.ldb = a->k, m.ldc = a->ldy, m.ldd = a->ldy, m.ldaux = a->ldy;
    m.alpha = 1.0f, m.beta = 0.0f;
    return m;
}

/* Group g's product on the host, rows [lo, hi). */
static void host_group(const weft__grouped_matmul_args *a, size_t g, size_t lo, size_t hi)
{
    const size_t es = weft__dtype_size(a->type);
    weft__matmul_args m = matmul_args(a, hi - lo);
    m.a = (const char *)a->x + lo * a->ldx * es;
    m.b = (const char *)a->w + g * a->n * a->k * es;
    m.d = (char *)a->y + lo * a->ldy * es;
    m.bias = a->bias ? (const char *)a->bias + g * a->n * es : NULL;
    m.host_ws = a->host_ws;
    weft__matmul_host_compute(&m);
}

static void host_run(weft__grouped_matmul_args *a)
{
    for (size_t g = 0; g < a->groups; g++) {
        size_t lo = clamp_row(a->offsets[g], a->rows), hi = clamp_row(a->offsets[g + 1], a->rows);
        if (hi > lo)
            host_group(a, g, lo, hi);
    }
    free(a->host_ws);
    a->host_ws = NULL;
}

static void run_host(const void *args)
{
    weft__grouped_matmul_args a = *(const weft__grouped_matmul_args *)args;
    host_run(&a);
}

static int check_offsets(const weft__grouped_matmul_args *a)
{
    const int32_t *o = a->offsets;
    if (o[0] < 0)
        return weft__fail(WEFT_EINVAL, "%s: offsets[0] = %d is negative", OP, (int)o[0]);
    for (size_t g = 0; g < a->groups; g++)
        if (o[g + 1] < o[g])
            return weft__fail(WEFT_EINVAL, "%s: offsets decrease at group %zu (%d after %d)", OP, g,
                              (int)o[g + 1], (int)o[g]);
    if ((size_t)o[a->groups] > a->rows)
        return weft__fail(WEFT_EINVAL, "%s: offsets[%zu] = %d is past the %zu rows", OP, a->groups,
                          (int)o[a->groups], a->rows);
    return WEFT_OK;
}

static int check_desc(const weft_grouped_matmul_desc *d, void *y, const void *x, const void *w,
                      const int32_t *offsets, weft__grouped_matmul_args *a)
{
    int rc;

    if (!d)
        return weft__fail(WEFT_EINVAL, "%s: desc is NULL", OP);
    for (size_t i = 0; i < sizeof d->reserved / sizeof d->reserved[0]; i++)
        if (d->reserved[i] != 0)
            return weft__fail(WEFT_EINVAL, "%s: desc->reserved[%zu] is not zero", OP, i);
    if ((rc = weft__check_dtype(OP, d->type)) != WEFT_OK) /* says so of a quantized type */
        return rc;
    if (d->type != WEFT_DTYPE_BF16 && d->type != WEFT_DTYPE_F16)
        return weft__fail(WEFT_EINVAL, "%s: type %d is not bf16 or fp16", OP, (int)d->type);
    if (d->groups == 0 || d->rows == 0 || d->n == 0 || d->k == 0)
        return weft__fail(WEFT_EINVAL,
                          "%s: groups, rows, n and k must be >= 1 (%zu, %zu, %zu, %zu)", OP,
                          d->groups, d->rows, d->n, d->k);
    if (d->groups > (size_t)INT32_MAX || d->rows > (size_t)INT32_MAX)
        return weft__fail(WEFT_EINVAL, "%s: groups and rows must fit the int32 offsets", OP);
    if ((unsigned)d->act > WEFT_MATMUL_ACT_GELU_ERF)
        return weft__fail(WEFT_EINVAL, "%s: unknown activation %d", OP, (int)d->act);

    *a = (weft__grouped_matmul_args){0};
    a->groups = d->groups, a->rows = d->rows, a->n = d->n, a->k = d->k;
    a->ldx = d->ldx ? d->ldx : d->k, a->ldy = d->ldy ? d->ldy : d->n;
    a->type = d->type, a->act = d->act, a->bias = d->bias;
    a->y = y, a->x = x, a->w = w, a->offsets = offsets;

    if ((rc = weft__check_rows(OP, "X", a->rows, a->k, a->ldx, a->type)) != WEFT_OK ||
        (rc = weft__check_rows(OP, "Y", a->rows, a->n, a->ldy, a->type)) != WEFT_OK)
        return rc;
    /* W is G x n rows of k; the bias G rows of n. */
    if (a->n > SIZE_MAX / a->groups ||
        (rc = weft__check_rows(OP, "W", a->groups * a->n, a->k, a->k, a->type)) != WEFT_OK ||
        (rc = weft__check_rows(OP, "bias", a->groups, a->n, a->n, a->type)) != WEFT_OK)
        return rc != WEFT_OK ? rc : weft__fail(WEFT_EINVAL, "%s: W is too large", OP);
    if ((rc = weft__check_ptr(OP, "Y", y, 0, a->type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "X", x, 0, a->type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "W", w, 0, a->type)) != WEFT_OK ||
        (rc = weft__check_ptr(OP, "bias", a->bias, 1, a->type)) != WEFT_OK)
        return rc;
    if (!offsets)
        return weft__fail(WEFT_EINVAL, "%s: offsets is NULL", OP);
    if ((uintptr_t)offsets % 4 != 0)
        return weft__fail(WEFT_EINVAL, "%s: offsets is not aligned to its 4-byte elements", OP);
    if (y == x || y == w)
        return weft__fail(WEFT_EINVAL, "%s: Y must not be X or W", OP);
    return WEFT_OK;
}

/* The workspace of weft_matmul's host reference, for every group. */
static int host_prepare(void *args)
{
    weft__grouped_matmul_args *a = args;
    weft__matmul_args m = matmul_args(a, 1);
    int rc = weft__matmul_host_prepare(OP, &m);
    a->host_ws = m.host_ws;
    return rc;
}

int weft_grouped_matmul(void *stream, const weft_grouped_matmul_desc *desc, void *y, const void *x,
                        const void *w, const int32_t *offsets)
{
    weft__grouped_matmul_args a;
    int rc;

    if ((rc = check_desc(desc, y, x, w, offsets, &a)) != WEFT_OK ||
        (rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    if (stream == WEFT_TASK_STREAM &&
        (rc = weft__task_stream_op_ws(OP, &stream, host_prepare, run_host, &a, sizeof a,
                                      &a.host_ws)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__grouped_matmul_cuda(stream, &a);
#endif
    if ((rc = check_offsets(&a)) != WEFT_OK || (rc = host_prepare(&a)) != WEFT_OK)
        return rc;
    host_run(&a);
    return WEFT_OK;
}

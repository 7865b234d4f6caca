/*
 * sparse.c - 2:4 structured sparsity: weft_prune_2_4, the sparse weight
 * (weft_sparse_weight_create, _destroy) and weft_matmul_sparse; their
 * checks, the host paths and the choice of backend.
 *
 * Why: a weight in the 2:4 pattern keeps half its values, and the sparse
 * tensor cores (Ampere and later) multiply it at twice the dense rate,
 * reading half the weight's bytes plus 2-bit positions: cuSPARSELt's
 * kernels, on the form its compression makes (sparse_cusparselt.cu). The
 * host keeps the pruned rows dense and runs weft_matmul on them
 * (OpenBLAS): the same product, and the reference the GPU's is tested
 * against.
 *
 * Every check runs here, before either backend sees the call, and asks the
 * same of both (cuSPARSELt's 16-byte layout rules too), so a call valid on
 * the host is valid on the GPU as far as weft can tell; what cuSPARSELt
 * refuses beyond that is known only by asking it, and named.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ops/ops_internal.h"
#include "ops/sparse.h"

static const char PRUNE[] = "weft_prune_2_4";
static const char CREATE[] = "weft_sparse_weight_create";
static const char OP[] = "weft_matmul_sparse";

/* ---- pruning ------------------------------------------------------------- */

static void prune_host(const weft__prune_args *a)
{
    size_t es = weft__dtype_size(a->dtype);
    for (size_t r = 0; r < a->rows; r++) {
        char *row = (char *)a->w + r * a->ld * es;
        for (size_t g = 0; g < a->cols; g += 4) {
            float x[4];
            for (int i = 0; i < 4; i++)
                x[i] = weft__load(a->dtype, row, g + (size_t)i);
            unsigned keep = weft__prune_keep(x);
            for (int i = 0; i < 4; i++)
                if (!(keep >> i & 1u))
                    memset(row + (g + (size_t)i) * es, 0, es);
        }
    }
}

static void run_prune_host(const void *args)
{
    prune_host(args);
}

int weft_prune_2_4(void *stream, weft_dtype dtype, void *w, size_t rows, size_t cols, size_t ld)
{
    int rc;
    if ((rc = weft__check_dtype(PRUNE, dtype)) != WEFT_OK)
        return rc;
    if (cols % 4 != 0)
        return weft__fail(WEFT_EINVAL, "%s: cols (%zu) must be a multiple of 4 (groups of four)",
                          PRUNE, cols);
    weft__prune_args x = {.dtype = dtype, .w = w, .rows = rows, .cols = cols, .ld = ld ? ld : cols};
    if ((rc = weft__check_rows(PRUNE, "w", rows, cols, x.ld, dtype)) != WEFT_OK ||
        (rc = weft__check_ptr(PRUNE, "w", w, 0, dtype)) != WEFT_OK ||
        (rc = weft__check_stream(PRUNE, stream)) != WEFT_OK)
        return rc;
    if (stream == WEFT_TASK_STREAM && (rc = weft__task_stream_op(PRUNE, &stream, run_prune_host, &x,
                                                                 sizeof x)) != WEFT__ON_STREAM)
        return rc;
#ifdef WEFT_HAVE_CUDA
    if (stream)
        return weft__prune_2_4_cuda(stream, &x);
#endif
    prune_host(&x);
    return WEFT_OK;
}

/* ---- the weight ------------------------------------------------------------ */

int weft__sparse_find_dense_group(weft_dtype type, const void *w, size_t n, size_t k, size_t ld,
                                  size_t *row, size_t *col)
{
    size_t es = weft__dtype_size(type);
    for (size_t r = 0; r < n; r++) {
        const char *p = (const char *)w + r * ld * es;
        for (size_t g = 0; g < k; g += 4) {
            int nonzero = 0;
            for (size_t i = 0; i < 4; i++)
                nonzero += weft__load(type, p, g + i) != 0.0f; /* NaN counts */
            if (nonzero > 2) {
                *row = r, *col = g;
                return nonzero;
            }
        }
    }
    return 0;
}

int weft__sparse_not_2_4(const char *op, weft_dtype type, const void *w, size_t n, size_t k,
                         size_t ld)
{
    size_t row, col;
    int nonzero = weft__sparse_find_dense_group(type, w, n, k, ld, &row, &col);
    if (!nonzero)
        return WEFT_OK;
    return weft__fail(WEFT_EINVAL,
                      "%s: w is not 2:4: row %zu has %d nonzeros in columns %zu-%zu, at most 2 "
                      "of each 4 may be (weft_prune_2_4 prunes it)",
                      op, row, nonzero, col, col + 3);
}

/* Whether p and a leading dimension of ld elements of es bytes keep
 * cuSPARSELt's 16-byte layout. */
static int aligned16(const void *p, size_t ld, size_t es)
{
    return (uintptr_t)p % 16 == 0 && (ld * es) % 16 == 0;
}

int weft_sparse_weight_create(void *stream, weft_dtype type, const void *w, size_t n, size_t k,
                              size_t ldw, weft_sparse_weight **out)
{
    int rc;
    if (!out)
        return weft__fail(WEFT_EINVAL, "%s: out is NULL", CREATE);
    *out = NULL;
    if (type != WEFT_DTYPE_BF16 && type != WEFT_DTYPE_F16)
        return weft__fail(WEFT_EINVAL,
                          "%s: type %d: the sparse weights are bf16 or fp16 (the sparse tensor "
                          "cores' 16-bit types)",
                          CREATE, (int)type);
    if (k % 4 != 0)
        return weft__fail(WEFT_EINVAL, "%s: k (%zu) must be a multiple of 4 (groups of four)",
                          CREATE, k);
    if (ldw == 0)
        ldw = k;
    if ((rc = weft__check_rows(CREATE, "w", n, k, ldw, type)) != WEFT_OK ||
        (rc = weft__check_ptr(CREATE, "w", w, 0, type)) != WEFT_OK ||
        (rc = weft__check_stream(CREATE, stream)) != WEFT_OK)
        return rc;
    if (!aligned16(w, ldw, 2))
        return weft__fail(WEFT_EINVAL,
                          "%s: w must be 16-byte aligned with ldw a multiple of 8 elements "
                          "(cuSPARSELt's layout; ldw %zu)",
                          CREATE, ldw);
    if (stream == WEFT_TASK_STREAM) {
        /* the weight is read now: after the task's earlier work (its
         * prune, its upload) */
        if ((rc = weft__op_task_stream(CREATE, &stream)) < 0 || (rc = weft_await()) != WEFT_OK)
            return rc;
    }

    weft_sparse_weight *sw = calloc(1, sizeof *sw);
    if (!sw)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory", CREATE);
    sw->type = type, sw->n = n, sw->k = k, sw->device = -1;
    if (stream) {
#ifdef WEFT_HAVE_CUDA
        if ((rc = weft__sparse_gpu_create(stream, type, w, n, k, ldw, &sw->gpu)) != WEFT_OK) {
            free(sw);
            return rc;
        }
        sw->device = weft__sparse_gpu_device(sw->gpu);
#endif
    } else {
        if ((rc = weft__sparse_not_2_4(CREATE, type, w, n, k, ldw)) != WEFT_OK) {
            free(sw);
            return rc;
        }
        size_t row = k * 2;
        if (!(sw->dense = malloc(n * row))) {
            free(sw);
            return weft__fail(WEFT_ENOMEM, "%s: out of memory for %zu x %zu", CREATE, n, k);
        }
        for (size_t r = 0; r < n; r++)
            memcpy((char *)sw->dense + r * row, (const char *)w + r * ldw * 2, row);
    }
    *out = sw;
    return WEFT_OK;
}

void weft_sparse_weight_destroy(weft_sparse_weight *w)
{
    if (!w)
        return;
#ifdef WEFT_HAVE_CUDA
    if (w->gpu)
        weft__sparse_gpu_destroy(w->gpu);
#endif
    free(w->dense);
    free(w);
}

size_t weft_sparse_weight_bytes(const weft_sparse_weight *w)
{
    if (!w)
        return 0;
#ifdef WEFT_HAVE_CUDA
    if (w->gpu)
        return weft__sparse_gpu_bytes(w->gpu);
#endif
    return w->n * w->k * weft__dtype_size(w->type);
}

/* ---- the product ----------------------------------------------------------- */

/* What weft_matmul_sparse asks beyond weft_matmul's checks. */
static int check_sparse_desc(const weft_matmul_desc *desc, const weft_sparse_weight *w)
{
    if (!desc)
        return weft__fail(WEFT_EINVAL, "%s: desc is NULL", OP);
    if (!w)
        return weft__fail(WEFT_EINVAL, "%s: w is NULL", OP);
    if (desc->type != w->type || (desc->in_type != 0 && desc->in_type != w->type))
        return weft__fail(WEFT_EINVAL, "%s: type and in_type must be the weight's (%d)", OP,
                          (int)w->type);
    if (desc->trans_a || !desc->trans_b)
        return weft__fail(WEFT_EINVAL,
                          "%s: trans_a must be 0 and trans_b 1 (the weight is n x k, a Linear "
                          "layer's layout)",
                          OP);
    if (desc->n != w->n || desc->k != w->k)
        return weft__fail(WEFT_EINVAL, "%s: n x k is %zu x %zu, the weight's %zu x %zu", OP,
                          desc->n, desc->k, w->n, w->k);
    if (desc->ldb != 0 || desc->batch > 1 || desc->stride_b != 0)
        return weft__fail(WEFT_EINVAL, "%s: ldb, stride_b must be 0 and batch 0 or 1", OP);
    if (desc->aux)
        return weft__fail(WEFT_EINVAL, "%s: aux is not kept by the sparse epilogue", OP);
    if (desc->in_type_b || desc->c_type || desc->scale_a_mode || desc->scale_b_mode ||
        desc->scale_a || desc->scale_b || desc->scale_d || desc->amax_d)
        return weft__fail(WEFT_EINVAL, "%s: the quantized fields must be zero", OP);
    return WEFT_OK;
}

static int rewrap(int rc)
{
    if (rc == WEFT_OK)
        return rc;
    char why[512];
    snprintf(why, sizeof why, "%s", weft_last_error());
    return weft__fail(rc, "%s: %s", OP, why);
}

int weft_matmul_sparse(void *stream, const weft_matmul_desc *desc, void *d, const void *a,
                       const weft_sparse_weight *w, const void *c)
{
    weft__matmul_args x;
    int rc;
    if ((rc = check_sparse_desc(desc, w)) != WEFT_OK)
        return rc;
    /* weft_matmul's own checks, with the weight standing for B */
    const void *b = w->dense ? w->dense : (const void *)w;
    if ((rc = weft__matmul_check(desc, d, a, b, c, &x)) != WEFT_OK)
        return rewrap(rc);
    if (!aligned16(a, x.lda, 2) || !aligned16(d, x.ldd, 2) || (c && !aligned16(c, x.ldc, 2)) ||
        (uintptr_t)x.bias % 16 != 0)
        return weft__fail(WEFT_EINVAL,
                          "%s: A, C, D and bias must be 16-byte aligned, with lda, ldc and ldd "
                          "multiples of 8 elements (cuSPARSELt's layout; lda %zu, ldd %zu)",
                          OP, x.lda, x.ldd);
    if ((rc = weft__check_stream(OP, stream)) != WEFT_OK)
        return rc;
    void *s = stream;
    if (stream == WEFT_TASK_STREAM && (rc = weft__op_task_stream(OP, &s)) < 0)
        return rc;
    if (s && w->device < 0)
        return weft__fail(WEFT_EINVAL,
                          "%s: w was made for the host; a GPU stream needs a weight made on "
                          "one (weft_sparse_weight_create with a stream)",
                          OP);
    if (!s && w->device >= 0)
        return weft__fail(WEFT_EINVAL,
                          "%s: w was made for GPU %d; the host needs a weight made with a NULL "
                          "stream",
                          OP, w->device);
    if (!s) /* NULL, or the task's host stream: weft_matmul on the pruned rows (x's b) */
        return rewrap(weft__matmul_enqueue(stream, &x));
#ifdef WEFT_HAVE_CUDA
    return weft__sparse_gpu_matmul(s, w->gpu, &x);
#else
    return weft__fail(WEFT_EINVAL, "%s: built without CUDA", OP);
#endif
}

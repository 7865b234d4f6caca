/*
 * common.c - what every operator family uses: argument checks, the
 * calling task's stream (WEFT_TASK_STREAM), and the Philox4x32-10 generator
 * behind dropout.
 *
 * The checks run before an op reads or writes anything, so a call either
 * fails with WEFT_EINVAL and a message naming the op and the argument, or
 * runs to the end. Philox is counter-based: the mask bit of element e is a
 * pure function of (seed, offset, e), so the forward pass, a backward pass
 * and a kernel with any thread layout all agree without storing a mask.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "ops/ops_internal.h"

static void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo)
{
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void weft__philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    static const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    static const uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];

    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(M0, c0, &hi0, &lo0);
        mulhilo(M1, c2, &hi1, &lo1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += W0;
        k1 += W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

int weft__dropout_keep(uint64_t seed, uint64_t offset, uint64_t e, float p)
{
    uint64_t block = e / 4;
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)offset,
                       (uint32_t)(offset >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t word[4];

    weft__philox4x32_10(ctr, key, word);
    /* 24 bits make a float in [0, 1) exactly, on the host and the device. */
    return (float)(word[e % 4] >> 8) * 0x1p-24f >= p;
}

int weft__check_dtype(const char *op, weft_dtype dtype)
{
    if (weft__is_f8(dtype) || dtype == WEFT_DTYPE_I8 || dtype == WEFT_DTYPE_I32)
        return weft__fail(WEFT_EINVAL,
                          "%s: dtype %d is a quantized type (FP8/INT8/INT32), which only "
                          "weft_matmul takes; use fp32, bf16 or fp16",
                          op, (int)dtype);
    if (dtype != WEFT_DTYPE_F32 && dtype != WEFT_DTYPE_BF16 && dtype != WEFT_DTYPE_F16)
        return weft__fail(WEFT_EINVAL, "%s: unsupported dtype %d", op, (int)dtype);
    return WEFT_OK;
}

int weft__check_rows(const char *op, const char *what, size_t rows, size_t cols, size_t stride,
                     weft_dtype dtype)
{
    size_t limit = SIZE_MAX / weft__dtype_size(dtype);

    if (rows == 0)
        return weft__fail(WEFT_EINVAL, "%s: %s has zero rows", op, what);
    if (cols == 0)
        return weft__fail(WEFT_EINVAL, "%s: %s has zero-length rows", op, what);
    if (stride < cols)
        return weft__fail(WEFT_EINVAL, "%s: %s stride %zu is smaller than its row (%zu)", op, what,
                          stride, cols);
    /* (rows-1)*stride + cols elements, and their bytes, must be addressable;
     * a "negative" size passed as size_t lands here. */
    if (stride > limit || rows - 1 > (limit - cols) / stride)
        return weft__fail(WEFT_EINVAL, "%s: %s of %zu rows by stride %zu is too large", op, what,
                          rows, stride);
    return WEFT_OK;
}

int weft__check_ptr(const char *op, const char *name, const void *p, int optional, weft_dtype dtype)
{
    if (p == NULL)
        return optional ? WEFT_OK : weft__fail(WEFT_EINVAL, "%s: %s is NULL", op, name);
    if ((uintptr_t)p % weft__dtype_size(dtype) != 0)
        return weft__fail(WEFT_EINVAL, "%s: %s is not aligned to its element size", op, name);
    return WEFT_OK;
}

int weft__check_stream(const char *op, void *stream)
{
#ifdef WEFT_HAVE_CUDA
    (void)op, (void)stream;
#else
    if (stream != NULL && stream != WEFT_TASK_STREAM)
        return weft__fail(WEFT_EINVAL, "%s: built without CUDA: a stream needs the GPU kernels",
                          op);
#endif
    return WEFT_OK;
}

/* A host reference call waiting in a stream, with its own copy of the
 * arguments. */
typedef struct host_call {
    void (*host)(const void *args);
    max_align_t args[];
} host_call;

static void run_host_call(void *arg)
{
    host_call *c = arg;
    c->host(c->args);
    free(c);
}

int weft__op_task_stream(const char *op, void **stream)
{
    int rc = weft_stream(stream);
    if (rc == WEFT_ENOTASK)
        return weft__fail(rc, "%s: WEFT_TASK_STREAM outside a task", op);
    if (rc != WEFT_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", weft_last_error());
        return weft__fail(rc, "%s: the task's stream: %s", op, why);
    }
    return *stream ? WEFT__ON_STREAM : WEFT_OK;
}

int weft__op_enqueue_host(const char *op, void (*host)(const void *args), const void *args,
                          size_t size)
{
    host_call *c = malloc(sizeof *c + size);
    if (!c)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory", op);
    c->host = host;
    memcpy(c->args, args, size);
    int rc = weft_host_async(run_host_call, c);
    if (rc != WEFT_OK)
        free(c);
    return rc;
}

int weft__task_stream_op_ws(const char *op, void **stream, int (*prepare)(void *args),
                            void (*host)(const void *args), void *args, size_t size, void **ws)
{
    int rc = weft__op_task_stream(op, stream);
    if (rc != WEFT_OK || (rc = prepare(args)) != WEFT_OK)
        return rc;
    if ((rc = weft__op_enqueue_host(op, host, args, size)) != WEFT_OK) {
        free(*ws); /* not enqueued: the memory is still the caller's */
        *ws = NULL;
    }
    return rc;
}

int weft__task_stream_op(const char *op, void **stream, void (*host)(const void *args),
                         const void *args, size_t size)
{
    int rc = weft__op_task_stream(op, stream);
    return rc == WEFT_OK ? weft__op_enqueue_host(op, host, args, size) : rc;
}

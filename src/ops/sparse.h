/*
 * sparse.h - what the 2:4 sparsity's files share: the pruning rule (the
 * host's, sparse.c, and the kernel's, sparse_prune.cu, pick the same two
 * of four), the weight, and the GPU paths: cuSPARSELt's compression and
 * sparse product (sparse_cusparselt.cu, or sparse_no_cusparselt.c in a
 * CUDA build without it).
 */
#ifndef WEFT_OPS_SPARSE_H
#define WEFT_OPS_SPARSE_H

#include <math.h>
#include <stddef.h>

#include "ops/matmul.h"
#include "weft/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The pruning rule on one group of four: bit i of the result set when
 * element i stays. An element stays when fewer than two others beat it; j
 * beats i when |x_j| > |x_i|, or they are equal and j comes first. NaN's
 * magnitude counts as +Inf, so a NaN always stays (and its row says so). */
#ifdef __CUDACC__
__host__ __device__
#endif
    static inline unsigned
    weft__prune_keep(const float x[4])
{
    float mag[4];
    for (int i = 0; i < 4; i++)
        mag[i] = x[i] != x[i] ? INFINITY : fabsf(x[i]);
    unsigned keep = 0;
    for (int i = 0; i < 4; i++) {
        int beaten = 0;
        for (int j = 0; j < 4; j++)
            beaten += j != i && (mag[j] > mag[i] || (mag[j] == mag[i] && j < i));
        keep |= (unsigned)(beaten < 2) << i;
    }
    return keep;
}

/* A checked prune: w is rows x cols (cols % 4 == 0), ld apart. */
typedef struct weft__prune_args {
    weft_dtype dtype;
    void *w;
    size_t rows, cols, ld;
} weft__prune_args;

/* The first group of four of w (n x k, ld apart, host memory) with more
 * than two nonzeros (NaN counts, -0 does not): its count, with *row and
 * *col its place; 0 when w is 2:4. */
int weft__sparse_find_dense_group(weft_dtype type, const void *w, size_t n, size_t k, size_t ld,
                                  size_t *row, size_t *col);
/* WEFT_OK when w (host memory) is 2:4, else WEFT_EINVAL naming op, the
 * row and the group. */
int weft__sparse_not_2_4(const char *op, weft_dtype type, const void *w, size_t n, size_t k,
                         size_t ld);

struct weft_sparse_weight {
    weft_dtype type;
    size_t n, k;
    int device;  /* the GPU it was made for; -1 for the host */
    void *dense; /* host: the pruned rows, n x k packed */
    void *gpu;   /* GPU: cuSPARSELt's form and plans (sparse_cusparselt.cu) */
};

#ifdef WEFT_HAVE_CUDA
/* The prune's kernel, enqueued on stream (sparse_prune.cu). */
int weft__prune_2_4_cuda(void *stream, const weft__prune_args *a);

/* Reads w (n x k, ldw apart, device memory) back to check it is 2:4, then
 * compresses it for cuSPARSELt on stream and waits: *out the weight's GPU
 * state. WEFT_EINVAL when w is not 2:4, when cuSPARSELt refuses the shape
 * or when the build lacks it (said so). */
int weft__sparse_gpu_create(void *stream, weft_dtype type, const void *w, size_t n, size_t k,
                            size_t ldw, void **out);
void weft__sparse_gpu_destroy(void *gpu);
/* The GPU a weight's state was made for, and its compressed bytes. */
int weft__sparse_gpu_device(const void *gpu);
size_t weft__sparse_gpu_bytes(const void *gpu);

/* Enqueues D = act(alpha A W^T + beta C + bias) on stream; a is checked
 * (its b unused), gpu the weight's state. */
int weft__sparse_gpu_matmul(void *stream, void *gpu, const weft__matmul_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif

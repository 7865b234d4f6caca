/*
 * moe.h - what the mixture-of-experts files share: each call's checked
 * arguments (moe.c and grouped_matmul.c check them and run the host
 * references; moe.cu and grouped_matmul.cu hold the kernels) and the one
 * ranking rule the router's selection follows on both sides.
 *
 * The selection must give the same ids on the host and the GPU whatever
 * the transcendentals round to, so it compares the logits themselves (the
 * scores are increasing in them) by rank.h's rule: larger logit first, NaN
 * below everything, -0 equal to +0, ties to the lower expert; the 64-bit
 * rank makes "the k largest ranks" one set in one order.
 */
#ifndef WEFT_OPS_MOE_H
#define WEFT_OPS_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "ops/rank.h"
#include "weft/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { WEFT__MOE_MAX_K = 8, WEFT__MOE_MAX_EXPERTS = 256 };

typedef struct weft__moe_gate_args {
    weft_dtype dtype;
    weft_moe_score score;
    int renormalize;
    const void *logits;
    size_t tokens, experts, stride, k;
    weft_moe_routing out;
} weft__moe_gate_args;

typedef struct weft__moe_permute_args {
    weft_dtype dtype;
    void *out;
    const void *in;
    const int32_t *perm;
    size_t tokens, k, cols, in_stride, out_stride;
} weft__moe_permute_args;

typedef struct weft__moe_unpermute_args {
    weft_dtype dtype;
    void *out;
    const void *y, *residual;
    const float *weights;
    const int32_t *inverse;
    size_t tokens, k, cols, y_stride, out_stride;
} weft__moe_unpermute_args;

/* Checked and resolved (leading dimensions set). */
typedef struct weft__grouped_matmul_args {
    size_t groups, rows, n, k, ldx, ldy;
    weft_dtype type;
    weft_matmul_act act;
    const void *bias;
    void *y;
    const void *x, *w;
    const int32_t *offsets;
    void *host_ws; /* the host reference's panels */
} weft__grouped_matmul_args;

#ifdef WEFT_HAVE_CUDA
/* Enqueue each call's kernels on stream (a cudaStream_t); the arguments
 * have been checked. WEFT_OK, or the launch's error with CUDA's name. */
int weft__moe_gate_cuda(void *stream, const weft__moe_gate_args *a);
int weft__moe_permute_cuda(void *stream, const weft__moe_permute_args *a);
int weft__moe_unpermute_cuda(void *stream, const weft__moe_unpermute_args *a);
int weft__grouped_matmul_cuda(void *stream, const weft__grouped_matmul_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif

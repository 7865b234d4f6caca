/*
 * conv.h - what weft_conv2d's files share: the checked arguments, the host
 * reference (conv_host.c), the BatchNorm fold's kernel (conv_fold.cu) and
 * the GPU convolution (conv_cudnn.c on cuDNN, or conv_no_cudnn.c in a
 * CUDA build without it).
 *
 * conv.c fills these structs from the caller's descriptor with every
 * default resolved (stride, dilation and groups of 1) and the output size
 * computed, so the backends read plain values.
 */
#ifndef WEFT_OPS_CONV_H
#define WEFT_OPS_CONV_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "weft/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A convolution, checked and resolved; sizes in elements. */
typedef struct weft__conv_args {
    size_t n, h, w, c, k, r, s;
    size_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
    size_t oh, ow;
    weft_dtype dtype;
    weft_conv_act act;
    int allow_tf32;
    void *out;
    const void *in, *wt, *bias;
} weft__conv_args;

/* A BatchNorm fold, checked: k output channels of per_k weights each. */
typedef struct weft__conv_fold_args {
    weft_dtype dtype, bn_dtype;
    size_t k, per_k;
    float eps;
    void *w_out, *bias_out;
    const void *w, *conv_bias, *gamma, *beta, *mean, *var;
} weft__conv_fold_args;

/* A convolution's shape, types and activation on a device: what the GPU
 * paths' plan caches key on (conv_cudnn.c's, conv_graph.c's). Compared
 * bytewise: weft__conv_key_fill zeroes it before filling it. */
typedef struct weft__conv_key {
    int device, dtype, act, tf32;
    uint64_t n, h, w, c, k, r, s, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
} weft__conv_key;

void weft__conv_key_fill(weft__conv_key *k, const weft__conv_args *a, int device);

/* The host references. */
void weft__conv_host(const weft__conv_args *a);
void weft__conv_fold_host(const weft__conv_fold_args *a);

#ifdef WEFT_HAVE_CUDA
/* The fold's kernel, enqueued on stream (conv_fold.cu). */
int weft__conv_fold_cuda(void *stream, const weft__conv_fold_args *a);

/* Enqueues the convolution on stream through cuDNN; the arguments have been
 * checked. WEFT_OK, or WEFT_EINVAL when cuDNN does not support the call
 * (the message names shape and types) or the build has no cuDNN,
 * WEFT_ENOMEM when a workspace cannot be had, WEFT_EDEVICE for the rest,
 * each before anything is enqueued (but for a failure of the bias add or
 * ReLU after a split call's convolution: WEFT_EDEVICE). */
int weft__conv_cuda(void *stream, const weft__conv_args *a);

/* How many calls found their plan cached, how many made one, and how many
 * ran split (cuDNN's fused call refused their shape: conv_cudnn.c). */
void weft__conv_cuda_plan_stats(unsigned long long *hits, unsigned long long *misses,
                                unsigned long long *split);

/* cuDNN's reason when the fused call last refused a shape for good ("" if
 * none has been). */
const char *weft__conv_cuda_last_split_why(void);

/* How many calls ran as one cuDNN operation graph (conv_graph.c) and how
 * many of its plans threads made; cuDNN's reason when the graph last
 * declined a shape ("" if never). */
void weft__conv_cuda_graph_stats(unsigned long long *calls, unsigned long long *plans);
const char *weft__conv_cuda_graph_why(void);

/* Whether calls try the operation graph before the legacy fused call (on
 * unless WEFT_CONV_GRAPH=0 is in the environment): the tests run their
 * cases both ways. */
void weft__conv_cuda_use_graph(int on);
#endif

#ifdef __cplusplus
}
#endif

#endif

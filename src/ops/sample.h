/*
 * sample.h - weft_sample's checked arguments and the arithmetic its host
 * reference (sample.c) and kernel (sample.cu) share, compiled for both
 * from this one text: a token's integer weight, the top-p goal, the draw's
 * Philox counter and the scaling of a uniform onto a total.
 */
#ifndef WEFT_OPS_SAMPLE_H
#define WEFT_OPS_SAMPLE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "weft/ops.h"

#ifdef __CUDACC__
#define WEFT__SAMPLE_HD __host__ __device__
#else
#define WEFT__SAMPLE_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct weft__sample_args {
    weft_dtype dtype;
    int32_t *ids;
    const void *logits;
    size_t rows, cols, stride;
    const weft_sampling *params;
    void *host_ws; /* the host reference's: cols (rank, weight) pairs */
} weft__sample_args;

/* Sums of weights fit 64 bits: at most 2^23 tokens of at most 2^32 each. */
#define WEFT__SAMPLE_MAX_COLS (1u << 23)

/* The draw's Philox counter is (SALT, 0, offset): a stream of its own
 * beside dropout's, which counts blocks where this holds a constant. */
#define WEFT__SAMPLE_SALT 0x73616d70u

/* floor(exp((l - l_max) / t) * 2^32): 2^32 for the largest logit, 0 for
 * NaN and -Inf and for what exp takes below 2^-32. */
WEFT__SAMPLE_HD static inline uint64_t weft__sample_weight(float l, float l_max, float t)
{
    if (!(l == l))
        return 0;
    return (uint64_t)(expf((l - l_max) / t) * 0x1p32f);
}

/* Whether a row draws at all (else it is greedy). */
WEFT__SAMPLE_HD static inline int weft__sample_draws(float temperature, float l_max)
{
    return temperature > 0 && l_max - l_max == 0; /* the latter: l_max finite */
}

/* The weight top_p keeps of total: ceil(total * top_p), top_p taken as a
 * 32-bit fraction; total when top_p is not in (0, 1). */
WEFT__SAMPLE_HD static inline uint64_t weft__sample_goal(uint64_t total, float top_p)
{
    if (!(top_p > 0 && top_p < 1))
        return total;
    uint64_t p = (uint64_t)(top_p * 0x1p32f), lo = (total & 0xffffffffu) * p;
    uint64_t goal = (total >> 32) * p + (lo >> 32) + ((lo & 0xffffffffu) != 0);
    return goal ? goal : 1;
}

/* floor(u * total / 2^64) for a 64-bit uniform u: below total. */
WEFT__SAMPLE_HD static inline uint64_t weft__sample_scale(uint64_t u, uint64_t total)
{
#ifdef __CUDA_ARCH__
    return __umul64hi(u, total);
#else
    return (uint64_t)(((unsigned __int128)u * total) >> 64);
#endif
}

#ifdef WEFT_HAVE_CUDA
/* Enqueues the kernel on stream (a cudaStream_t); the arguments have been
 * checked. WEFT_OK, or the launch's error with CUDA's name. */
int weft__sample_cuda(void *stream, const weft__sample_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif

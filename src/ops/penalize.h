/*
 * penalize.h - weft_penalize's checked arguments and the one adjustment
 * of a logit, compiled for the host reference (penalize.c) and the kernel
 * (penalize.cu) from this one text.
 */
#ifndef WEFT_OPS_PENALIZE_H
#define WEFT_OPS_PENALIZE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "weft/ops.h"

#ifdef __CUDACC__
#define WEFT__PENALIZE_HD __host__ __device__
#else
#define WEFT__PENALIZE_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct weft__penalize_args {
    weft_dtype dtype;
    void *logits;
    size_t rows, cols, stride;
    const weft_penalties *params;
    const weft_logit_adjust *adjust;
} weft__penalize_args;

/* Logit x of a token with adjustment a under row p's penalties. */
WEFT__PENALIZE_HD static inline float weft__penalized(float x, const weft_penalties *p,
                                                      const weft_logit_adjust *a)
{
    if (a->seen && p->repetition != 0 && p->repetition != 1)
        x = x > 0 ? x / p->repetition : x * p->repetition;
    if (a->count > 0) /* one rounding of frequency * count + presence, on both sides */
        x -= fmaf(p->frequency, (float)a->count, p->presence);
    return x + a->bias;
}

#ifdef WEFT_HAVE_CUDA
/* Enqueues the kernel on stream (a cudaStream_t); the arguments have been
 * checked. WEFT_OK, or the launch's error with CUDA's name. */
int weft__penalize_cuda(void *stream, const weft__penalize_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif

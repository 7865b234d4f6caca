/*
 * quantize.h - weft_quantize_fp8's checked arguments, shared by quantize.c
 * (the checks and the host reference) and quantize.cu (the kernel), and
 * the quantization itself - a row's scale from its largest magnitude, an
 * element's code - which weft_rmsnorm_fp8's host reference (norm.c) takes
 * from here so that the two write the same bytes.
 */
#ifndef WEFT_OPS_QUANTIZE_H
#define WEFT_OPS_QUANTIZE_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/ops_internal.h"
#include "weft/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct weft__quantize_args {
    weft_dtype out_type, in_type;
    void *out;
    float *scales;
    const void *in;
    size_t rows, cols, in_stride, out_stride;
} weft__quantize_args;

/* F: the largest finite value of FP8 type t, which a row's amax maps to. */
static inline float weft__fp8_top(weft_dtype t)
{
    return t == WEFT_DTYPE_F8_E4M3 ? 448.0f : 57344.0f;
}

/* A row's scale from its largest magnitude: amax / F, at least FLT_MIN
 * (a row of zeros). */
static inline float weft__fp8_scale(weft_dtype t, float amax)
{
    return fmaxf(amax / weft__fp8_top(t), FLT_MIN);
}

/* An element's code: v / scale in IEEE fp32, rounded and saturated. */
static inline uint8_t weft__fp8_code(weft_dtype t, float v, float scale)
{
    return weft__f32_to_f8(t, v / scale);
}

/* The bytes [*lo, *hi) that rows of cols elements of es bytes, stride
 * elements apart, span from p: what the overlap checks compare. */
static inline void weft__extent(const void *p, size_t rows, size_t cols, size_t stride, size_t es,
                                uintptr_t *lo, uintptr_t *hi)
{
    *lo = (uintptr_t)p;
    *hi = *lo + ((rows - 1) * stride + cols) * es;
}

#ifdef WEFT_HAVE_CUDA
/* Enqueues the kernel on stream (a cudaStream_t); the arguments have been
 * checked. WEFT_OK, or the launch's error with CUDA's name. */
int weft__quantize_cuda(void *stream, const weft__quantize_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif

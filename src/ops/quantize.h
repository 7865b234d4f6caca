/*
 * quantize.h - weft_quantize_fp8's checked arguments, shared by quantize.c
 * (the checks and the host reference) and quantize.cu (the kernel).
 */
#ifndef WEFT_OPS_QUANTIZE_H
#define WEFT_OPS_QUANTIZE_H

#include <stddef.h>

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

#ifdef WEFT_HAVE_CUDA
/* Enqueues the kernel on stream (a cudaStream_t); the arguments have been
 * checked. WEFT_OK, or the launch's error with CUDA's name. */
int weft__quantize_cuda(void *stream, const weft__quantize_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif

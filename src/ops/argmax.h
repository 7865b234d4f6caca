/*
 * argmax.h - weft_argmax's checked arguments, shared by argmax.c (the
 * checks and the host reference) and argmax.cu (the kernel). Both choose
 * by rank.h's order, so both give the same id for the same row.
 */
#ifndef WEFT_OPS_ARGMAX_H
#define WEFT_OPS_ARGMAX_H

#include <stddef.h>
#include <stdint.h>

#include "weft/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct weft__argmax_args {
    weft_dtype dtype;
    int32_t *ids;
    const void *in;
    size_t rows, cols, stride;
} weft__argmax_args;

#ifdef WEFT_HAVE_CUDA
/* Enqueues the kernel on stream (a cudaStream_t); the arguments have been
 * checked. WEFT_OK, or the launch's error with CUDA's name. */
int weft__argmax_cuda(void *stream, const weft__argmax_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif

/*
 * gather.h - weft_gather_rows's checked arguments, shared by gather.c (the
 * checks and the host reference) and gather.cu (the kernel).
 */
#ifndef WEFT_OPS_GATHER_H
#define WEFT_OPS_GATHER_H

#include <stddef.h>
#include <stdint.h>

#include "weft/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct weft__gather_args {
    weft_dtype dtype;
    void *out;
    const void *table;
    const int32_t *ids;
    size_t rows, cols, table_rows, table_stride, out_stride;
} weft__gather_args;

#ifdef WEFT_HAVE_CUDA
/* Enqueues the kernel on stream (a cudaStream_t); the arguments have been
 * checked. WEFT_OK, or the launch's error with CUDA's name. */
int weft__gather_rows_cuda(void *stream, const weft__gather_args *a);
#endif

#ifdef __cplusplus
}
#endif

#endif

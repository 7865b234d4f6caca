/*
 * cudnn_context.h - what a cuDNN call of weft's needs besides its own
 * descriptors: the calling thread's cuDNN handle for a device, and the
 * stream's workspace (cudnn_context.c). With cuDNN only.
 */
#ifndef WEFT_OPS_CUDNN_CONTEXT_H
#define WEFT_OPS_CUDNN_CONTEXT_H

#include <stddef.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>

/* A workspace's size, and how many streams get one. */
enum { WEFT__CUDNN_WORKSPACE = 32 << 20, WEFT__CUDNN_MAX_WORKSPACES = 256 };

/* The calling thread's handle for device (made on first use), for op's
 * messages. WEFT_OK, or an error with the reason recorded. */
int weft__cudnn_handle(const char *op, int device, cudnnHandle_t *out);

/* stream's workspace on device (made on its first use): WEFT__CUDNN_WORKSPACE
 * bytes, or none (*size 0) past WEFT__CUDNN_MAX_WORKSPACES streams. Never
 * call it while stream is being captured: it may allocate. */
int weft__cudnn_workspace(const char *op, cudaStream_t stream, int device, void **ptr,
                          size_t *size);

#endif

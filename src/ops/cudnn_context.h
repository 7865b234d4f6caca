/*
 * cudnn_context.h - what a cuDNN call of weft's needs besides its own
 * descriptors: the calling thread's cuDNN handle for a device
 * (cudnn_context.c); the stream's workspace is workspace.h's. With cuDNN
 * only.
 */
#ifndef WEFT_OPS_CUDNN_CONTEXT_H
#define WEFT_OPS_CUDNN_CONTEXT_H

#include <stddef.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>

/* The calling thread's handle for device (made on first use), for op's
 * messages. WEFT_OK, or an error with the reason recorded. */
int weft__cudnn_handle(const char *op, int device, cudnnHandle_t *out);

#endif

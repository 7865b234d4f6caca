/*
 * workspace.h - the scratch memory NVIDIA's libraries ask of weft's calls
 * (cuBLASLt's matmuls, cuDNN's convolutions), one block per stream that
 * they share (workspace.c). With CUDA only.
 */
#ifndef WEFT_OPS_WORKSPACE_H
#define WEFT_OPS_WORKSPACE_H

#include <stddef.h>

#include <cuda_runtime_api.h>

/* A workspace's size (cuBLASLt's advice for Hopper: enough for its split-K
 * and stream-K algorithms at any shape), and how many streams get one. */
enum { WEFT__WORKSPACE = 32 << 20, WEFT__MAX_WORKSPACES = 256 };

/* stream's workspace on device, made on its first use: WEFT__WORKSPACE
 * bytes, or none (*size 0) past WEFT__MAX_WORKSPACES streams. WEFT_OK, or
 * an error naming op. Never call it while stream is being captured: it may
 * allocate, and a captured call must take none (see workspace.c). */
int weft__stream_workspace(const char *op, cudaStream_t stream, int device, void **ptr,
                           size_t *size);

#endif

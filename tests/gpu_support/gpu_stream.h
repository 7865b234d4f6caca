/*
 * gpu_stream.h - what the operator tests on the GPU share: a weft runtime
 * on the CUDA backend and a plain CUDA stream of the test's own, made by
 * the group's setup and destroyed by its teardown; CUDA calls checked in
 * the test's thread; buffers copied to the device and back.
 *
 * The operators take the caller's cudaStream_t: a test calls them on its
 * stream from its own thread (and on tasks' streams through the runtime),
 * so every CUDA call here is checked with cmocka's assertions and must run
 * in the test's thread, never inside a task.
 */
#ifndef WEFT_GPU_STREAM_H
#define WEFT_GPU_STREAM_H

#include <cuda_runtime_api.h>

#include "gpu_support/gpu_test.h"

/* In the test's thread: a CUDA call that must succeed, named with its
 * error if it does not. */
#define assert_cuda(expr)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            fail_msg("%s: %s (%s)", #expr, cudaGetErrorName(e_), cudaGetErrorString(e_));          \
    } while (0)

/* For the group's setup: a runtime of 2 workers on the CUDA backend and a
 * non-blocking stream (one that never waits on the legacy default stream).
 * 0, or -1 with the reason on stderr. */
static inline int gt_stream_setup(weft_runtime **rt, cudaStream_t *stream)
{
    weft_config cfg = {.workers = 2, .backend = WEFT_BACKEND_CUDA};
    if (weft_runtime_create(rt, &cfg) != WEFT_OK) {
        fprintf(stderr, "weft_runtime_create: %s\n", weft_last_error());
        return -1;
    }
    return cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking) == cudaSuccess ? 0 : -1;
}

/* For the group's teardown: both destroyed, 0 when both went well. */
static inline int gt_stream_teardown(weft_runtime *rt, cudaStream_t stream)
{
    int ok = cudaStreamDestroy(stream) == cudaSuccess;
    return weft_runtime_destroy(rt) == WEFT_OK && ok ? 0 : -1;
}

/* cudaMemset and a copy from pageable memory run on the legacy default
 * stream and may still be in flight when they return; the test's stream
 * does not wait for that stream. So each is followed by a device-wide
 * synchronization before an operator can read or overwrite its bytes. */

/* cudaMemset, finished when it returns. */
static inline cudaError_t gt_memset(void *dev, int byte, size_t bytes)
{
    cudaError_t e = cudaMemset(dev, byte, bytes);
    return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

/* A copy of bytes from host memory h to dev, finished when it returns. */
static inline cudaError_t gt_copy_in(void *dev, const void *h, size_t bytes)
{
    cudaError_t e = cudaMemcpy(dev, h, bytes, cudaMemcpyHostToDevice);
    return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

/* A device buffer of bytes (at least 1) holding a copy of h; h NULL (or
 * bytes 0): the buffer only, its contents undefined. cudaFree it. */
static inline void *gt_upload(const void *h, size_t bytes)
{
    void *p = NULL;
    assert_cuda(cudaMalloc(&p, bytes ? bytes : 1));
    if (h && bytes)
        assert_cuda(gt_copy_in(p, h, bytes));
    return p;
}

/* A malloc'ed host copy of bytes of device memory at dev; free it. */
static inline void *gt_download(const void *dev, size_t bytes)
{
    void *h = gt_xmalloc(bytes);
    if (bytes)
        assert_cuda(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost));
    return h;
}

#endif

/*
 * device.h - the interface every device backend implements.
 *
 * A device executes streams: in-order queues of operations (copies, memsets,
 * host functions, and for GPUs kernels). A task leases a stream on its first
 * enqueue and gives it back once that work has completed, so independent
 * tasks do not queue behind each other while the pool lasts. Backends:
 * host.c (host threads) and, with CUDA, cuda.c. The core never branches on
 * the backend; it calls through weft__device_ops.
 *
 * Backends know nothing of tasks: to wait, they use the waiter protocol of
 * task/wait.h, which suspends a task or blocks a thread alike.
 */
#ifndef WEFT_DEVICE_H
#define WEFT_DEVICE_H

#include <stddef.h>

#include "task/wait.h"

typedef struct weft__device weft__device;
typedef struct weft__stream weft__stream;

typedef struct weft__device_ops {
    const char *name; /* "host", "cuda" */

    /* Wait for every stream to drain, then free the device. */
    void (*destroy)(weft__device *dev);

    /* Take a stream for one task's work. When the pool is exhausted a
     * backend may hand out a stream that is already leased (shared, in
     * order); it never fails for lack of streams. Returns WEFT_OK or an
     * error (WEFT_EDEVICE, WEFT_ENOMEM). */
    int (*stream_lease)(weft__device *dev, weft__stream **s);

    /* Give s back. Everything enqueued on it by this lease has completed. */
    void (*stream_return)(weft__device *dev, weft__stream *s);

    /* Enqueue an operation; it runs after everything enqueued before it on
     * s. Errors found at enqueue time are returned; errors during execution
     * are reported by the next sync. */
    int (*copy)(weft__stream *s, void *dst, const void *src, size_t n);
    int (*fill)(weft__stream *s, void *dst, int value, size_t n);
    int (*host_fn)(weft__stream *s, void (*fn)(void *arg), void *arg);

    /* Suspend the calling task (or block the calling thread) until every
     * operation enqueued on s so far has completed. Not cancellable: work
     * still in flight may point into the caller's stack. Returns WEFT_OK,
     * or WEFT_EDEVICE (with the last-error message set) if an operation
     * failed since the previous sync. */
    int (*sync)(weft__stream *s);
} weft__device_ops;

struct weft__device {
    const weft__device_ops *ops;
    unsigned index; /* position in the runtime's device table */
};

/* The host backend: streams executed by `threads` host threads (0: 2). Its
 * stream pool grows on demand up to WEFT__HOST_STREAMS_MAX streams; beyond
 * that, a lease shares the stream with the fewest leases. */
#define WEFT__HOST_STREAMS_MAX 1024
int weft__host_device_create(weft__device **dev, unsigned threads);

#endif

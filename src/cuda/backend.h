/*
 * backend.h - the CUDA backend's stream and device records, and what its
 * files share (src/cuda/).
 *
 * backend.c opens GPUs, pools streams and enqueues work. Each other owner
 * keeps its state in a record of its own, declared in its own header and
 * embedded here: the completion engine (engine.h), graph mode (graph.h,
 * record.h), tracing (timing.h, for timing.c and cupti.c), pinned memory
 * (memory.h), device blocks (blocks.h). A record's fields are its owner's to change; the others
 * read them at most. Built with CUDA only: without it the build takes src/device/no_cuda.c instead
 * of this folder.
 */
#ifndef WEFT_CUDA_BACKEND_H
#define WEFT_CUDA_BACKEND_H

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "core/lock.h"
#include "cuda/blocks.h"
#include "cuda/engine.h"
#include "cuda/graph.h"
#include "cuda/memory.h"
#include "cuda/timing.h"
#include "device/device.h"

typedef struct weft__cuda_device weft__cuda_device;

/* A CUDA stream: the backend's part first, then each owner's record. */
struct weft__stream {
    _Alignas(64) weft__lock lock; /* guards the marker state and the records below */
    cudaStream_t handle;
    weft__cuda_device *dev;
    uint64_t marked;       /* last sequence number enqueued */
    unsigned leases;       /* guarded by dev->pool_lock */
    int class_;            /* 0 normal and low, 1 high */
    bool busy;             /* has work outstanding (the device's busy time) */
    _Atomic bool unmarked; /* work enqueued since the last marker; implies busy */
    bool handle_out;       /* weft_stream gave the handle out: the caller may capture */

    weft__cuda_engine_stream engine; /* completion (engine.c) */
    weft__cuda_graph_stream graph;   /* graph mode (graph.c, record.c) */
    weft__cuda_timing_stream timing; /* tracing (timing.c, cupti.c) */
    weft__stream_counts counts;      /* for the run's diagnosis (device.h) */
    weft__cuda_kept_blocks kept;     /* freed device blocks kept (blocks.c) */
};

struct weft__cuda_device {
    weft__device base; /* first: the core sees only this */
    int ordinal;
    int priority[2]; /* CUDA stream priority of each class */

    weft__lock pool_lock;
    weft__stream *streams[2][WEFT__CUDA_MAX_STREAMS];
    unsigned nstreams[2];
    unsigned next_shared[2];
    atomic_uint leased;
    atomic_uint leased_max;
    atomic_int failed; /* the sticky cudaError_t, 0 while healthy */

    weft__cuda_host_pool host_pool;  /* memory.c */
    weft__cuda_engine_device engine; /* completion (engine.c) */
    weft__cuda_graph_device graph;   /* graph mode (graph.c) */
    weft__cuda_timing_device timing; /* tracing (timing.c) */
};

/* ---- backend.c ------------------------------------------------------------ */

/* Turn a CUDA error from call into a weft status with the error's name in
 * the message; a sticky one marks the device failed. */
int weft__cuda_fail(weft__cuda_device *dev, const char *call, cudaError_t e);
/* The same for a refused cudaLaunchKernel of a task's own kernel: a kernel
 * unknown to weft's CUDA runtime gets a message naming the likely cause. */
int weft__cuda_launch_fail(weft__cuda_device *dev, cudaError_t e);

/* WEFT_EDEVICE (message set) once the device has failed. */
int weft__cuda_check_failed(weft__cuda_device *dev, const char *call);

/* Make dev the calling thread's current device. */
int weft__cuda_use_device(weft__cuda_device *dev);

/* Before any enqueue: the device must be healthy and current. It also ends
 * the chaining of timing events (timing.c): what comes next is enqueued
 * after the newest timed operation's end. */
int weft__cuda_enter(weft__stream *s, const char *call);

/* Pageable host memory: CUDA reads it at enqueue time (host to device) or
 * synchronizes (device to host), which breaks stream order; graph nodes
 * cannot reach it at all. */
bool weft__cuda_pageable(const void *p);

/* A stream of dev outside the lease pool, with no completion word (it is
 * never awaited): graph mode records regions on such streams. */
int weft__cuda_stream_create_bare(weft__cuda_device *dev, weft__stream **out);
void weft__cuda_stream_destroy_bare(weft__stream *s);

/* Work is about to be enqueued on s: from idle, the device's busy time
 * starts. It ends when a marker placed after the work is seen complete
 * (idle_if_done, engine.c). After the first operation this is one
 * relaxed load. Kernels, copies, memsets, host functions, graph launches
 * and the handle given out call it. */
static inline void weft__cuda_note_work(weft__stream *s)
{
    if (s->graph.capture || atomic_load_explicit(&s->unmarked, memory_order_relaxed))
        return;
    weft__lock_acquire(&s->lock);
    atomic_store_explicit(&s->unmarked, true, memory_order_relaxed);
    if (!s->busy) {
        s->busy = true;
        weft__busy_begin(&s->dev->base.busy);
    }
    weft__lock_release(&s->lock);
}

/* The stream's place in the device's pool: its track in the timeline. */
static inline unsigned weft__cuda_stream_index(const weft__stream *s)
{
    return (unsigned)((s->engine.flag - s->dev->engine.flags) / WEFT__CUDA_FLAG_STRIDE);
}

#endif

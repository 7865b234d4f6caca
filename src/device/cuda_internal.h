/*
 * cuda_internal.h - what the two halves of the CUDA backend share.
 *
 * cuda.c opens GPUs, pools streams and enqueues work; cuda_engine.c decides
 * when that work is complete (the completion engine). Only compiled with
 * CUDA.
 */
#ifndef WEFT_CUDA_INTERNAL_H
#define WEFT_CUDA_INTERNAL_H

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "core/lock.h"
#include "device/cuda_memory.h"
#include "device/device.h"

enum {
    WEFT__CUDA_MAX_STREAMS = 256, /* per priority class; beyond, leases share */
    WEFT__CUDA_FLAG_STRIDE = 16,  /* words between completion flags: a cache line each */
};

/* How a marker's completion is noticed (cuda_engine.c says what each costs;
 * WEFT_CUDA_COMPLETION=auto|flag|event|callback in the environment). */
typedef enum weft__cuda_completion {
    WEFT__CUDA_FLAG,     /* the GPU writes the sequence number into mapped memory */
    WEFT__CUDA_EVENT,    /* a CUDA event per marker, queried by the engine */
    WEFT__CUDA_CALLBACK, /* a host function per marker fires the waiters itself */
    WEFT__CUDA_AUTO      /* flags, or events while many streams complete often */
} weft__cuda_completion;

typedef struct weft__cuda_device weft__cuda_device;

/* An event recorded as a marker, while the engine waits for it. */
typedef struct weft__cuda_mark_event {
    uint64_t seq;
    cudaEvent_t event;
} weft__cuda_mark_event;

struct weft__stream {
    _Alignas(64) weft__lock lock; /* guards the marker state below */
    cudaStream_t handle;
    weft__cuda_device *dev;
    uint64_t marked;                  /* last sequence number enqueued */
    weft__waitq pending;              /* waiters, in sequence order */
    bool active;                      /* on dev->active (changed holding both locks) */
    unsigned leases;                  /* guarded by dev->pool_lock */
    int class_;                       /* 0 normal and low, 1 high */
    weft__stream *next_capture;       /* a capture stream's free-list link */
    bool capture;                     /* records for graph mode, never runs or waits */
    bool recording;                   /* a capture stream keeping a record, not capturing */
    struct weft__cuda_record *record; /* what it recorded (cuda_record.c) */
    bool busy;                        /* has work outstanding (the device's busy time) */
    _Atomic bool unmarked;            /* work enqueued since the last marker; implies busy */

    volatile uint32_t *flag; /* FLAG, AUTO: written by the GPU */
    CUdeviceptr flag_device;
    _Atomic uint64_t flag_marked;  /* AUTO: the last marker that is a flag */
    _Atomic uint64_t done;         /* EVENT, CALLBACK, AUTO: highest sequence known done */
    weft__cuda_mark_event *events; /* EVENT, AUTO: recorded, oldest first (a ring) */
    unsigned ev_head, ev_count, ev_cap;
    cudaEvent_t *spare; /* EVENT, AUTO: events to record again */
    unsigned nspare, spare_cap;

    /* tracing (cuda_trace.c), guarded by lock but for timing_chain, which
     * only the task enqueuing on the stream (its leaseholder) touches */
    struct weft__cuda_timed *timed; /* operations awaiting read-back, oldest first (a ring) */
    unsigned timed_head, timed_count, timed_cap;
    cudaEvent_t *timing_spare; /* timing events to record again */
    unsigned ntiming_spare, timing_spare_cap;
    bool timing_chain;     /* nothing enqueued since the newest timed op's end
                            * event: the next op may start from it */
    bool timed_end_known;  /* timed_end_ns holds the last read-back op's end */
    uint64_t timed_end_ns; /* host time: where an op chained to it starts */
};

struct weft__cuda_device {
    weft__device base; /* first: the core sees only this */
    int ordinal;
    int priority[2]; /* CUDA stream priority of each class */
    weft__cuda_completion completion;

    weft__lock pool_lock;
    weft__stream *streams[2][WEFT__CUDA_MAX_STREAMS];
    unsigned nstreams[2];
    unsigned next_shared[2];
    atomic_uint leased;

    uint32_t *flags; /* 2 * MAX_STREAMS completion words, mapped */
    CUdeviceptr flags_device;

    weft__lock active_lock; /* guards active; also keeps one poller at a time */
    weft__stream *active[2 * WEFT__CUDA_MAX_STREAMS];
    unsigned nactive;
    atomic_uint npending; /* waiters, all streams */
    atomic_int failed;    /* the sticky cudaError_t, 0 while healthy */
    uint64_t last_backstop;
    unsigned next_query; /* the backstop's turn among active streams */
    unsigned next_poll;  /* EVENT, AUTO: where the next sweep starts */
    uint64_t last_sweep; /* EVENT, AUTO: when every active stream was last queried */
    /* AUTO: the waiters the pollers fired since rate_start, and whether the
     * last full window was crowded enough for markers to be events */
    unsigned rate_fired;
    _Atomic uint64_t rate_start;
    atomic_bool crowded;

    weft__cuda_host_pool host_pool;

    /* graph mode (cuda_graph.c) */
    weft__lock graph_lock;
    struct weft__cuda_graph *graphs; /* cached executable graphs */
    weft__stream *captures;          /* idle capture streams */
    unsigned ngraphs, graph_cap;
    uint64_t graph_clock;         /* for least recently used */
    weft_graph_stats graph_stats; /* guarded by graph_lock */

    /* tracing (cuda_trace.c): an event whose host time is known, which
     * the device times of operations are measured from */
    weft__lock anchor_lock;
    cudaEvent_t anchor;
    uint64_t anchor_ns;
    cudaStream_t anchor_stream;
};

/* ---- cuda.c -------------------------------------------------------------- */

/* Turn a CUDA error from call into a weft status with the error's name in
 * the message; a sticky one marks the device failed. */
int weft__cuda_fail(weft__cuda_device *dev, const char *call, cudaError_t e);

/* WEFT_EDEVICE (message set) once the device has failed. */
int weft__cuda_check_failed(weft__cuda_device *dev, const char *call);

/* Make dev the calling thread's current device. */
int weft__cuda_use_device(weft__cuda_device *dev);

/* Before any enqueue: the device must be healthy and current. It also ends
 * the chaining of timing events (cuda_trace.c): what comes next is enqueued
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
 * (idle_if_done, cuda_engine.c). After the first operation this is one
 * relaxed load. Kernels, copies, memsets, host functions, graph launches
 * and the handle given out call it. */
static inline void weft__cuda_note_work(weft__stream *s)
{
    if (s->capture || atomic_load_explicit(&s->unmarked, memory_order_relaxed))
        return;
    weft__lock_acquire(&s->lock);
    atomic_store_explicit(&s->unmarked, true, memory_order_relaxed);
    if (!s->busy) {
        s->busy = true;
        weft__busy_begin(&s->dev->base.busy);
    }
    weft__lock_release(&s->lock);
}

/* ---- cuda_graph.c ------------------------------------------------------- */

int weft__cuda_graph_init(weft__cuda_device *dev, unsigned cap);
void weft__cuda_graph_fini(weft__cuda_device *dev);
int weft__cuda_region_begin(weft__stream *s, weft__stream **capture);
int weft__cuda_region_end(weft__stream *s, weft__stream *capture, uint64_t key);
void weft__cuda_region_abandon(weft__stream *capture);
/* Turn a recording region into a stream capture, its record enqueued
 * first; nothing when it is capturing already. */
int weft__cuda_region_capture(weft__stream *capture);
void weft__cuda_graph_stats(weft__device *d, weft_graph_stats *sum);

/* ---- cuda_record.c ------------------------------------------------------ */

typedef struct weft__cuda_record weft__cuda_record;

/* A record_* call could not record the operation: the caller captures the
 * region (weft__cuda_region_capture) and enqueues it as usual. */
#define WEFT__CUDA_NOT_RECORDED 1

weft__cuda_record *weft__cuda_record_new(void);
void weft__cuda_record_free(weft__cuda_record *r);
void weft__cuda_record_reset(weft__cuda_record *r);
unsigned weft__cuda_record_length(const weft__cuda_record *r);
int weft__cuda_record_launch(weft__cuda_record *r, const void *kernel, weft_dim3 grid,
                             weft_dim3 block, size_t shared_bytes, void **args);
int weft__cuda_record_fill(weft__cuda_record *r, void *dst, int value, size_t n);
int weft__cuda_record_copy(weft__cuda_record *r, void *dst, const void *src, size_t n);

/* Enqueue the recorded operations on stream, in order. */
cudaError_t weft__cuda_record_enqueue(const weft__cuda_record *r, cudaStream_t stream);
/* A graph of the recorded operations as a chain; nodes[i] is operation i. */
cudaError_t weft__cuda_record_build(const weft__cuda_record *r, cudaGraph_t *graph,
                                    cudaGraphNode_t **nodes);
/* Same operations and kernels in the same order: one graph serves both. */
bool weft__cuda_record_same_shape(const weft__cuda_record *a, const weft__cuda_record *b);
/* Bring exec, instantiated from was's graph (nodes), to now's parameters,
 * setting only the nodes that differ (*changed counts them). */
cudaError_t weft__cuda_record_apply(cudaGraphExec_t exec, const cudaGraphNode_t *nodes,
                                    const weft__cuda_record *was, const weft__cuda_record *now,
                                    unsigned *changed);

/* ---- cuda_trace.c ------------------------------------------------------- */

void *weft__cuda_trace_begin(weft__stream *s, weft__op_kind kind);
void weft__cuda_trace_end(weft__stream *s, void *begin, const weft__op_info *op);
void weft__cuda_trace_collect(weft__stream *s);
void weft__cuda_trace_flush(weft__device *dev);
void weft__cuda_trace_prepare(weft__device *dev);
void weft__cuda_trace_stream_fini(weft__stream *s);
void weft__cuda_trace_fini(weft__cuda_device *dev);

/* A kernel's name for the timeline, looked up once per kernel; a mangled
 * name's last component (buf holds what is not kept). */
const char *weft__cuda_kernel_name(const void *kernel, char *buf, size_t size);
const char *weft__cuda_demangle(const char *name, char *buf, size_t size);

/* The stream's place in the device's pool: its track in the timeline. */
static inline unsigned weft__cuda_stream_index(const weft__stream *s)
{
    return (unsigned)((s->flag - s->dev->flags) / WEFT__CUDA_FLAG_STRIDE);
}

/* How a trace times GPU operations, as WEFT_TRACE_GPU says: CUPTI's records
 * (cupti, the default), CUDA events (events), or not at all (off: the
 * tasks and their waits only). */
typedef enum weft__gpu_timing {
    WEFT__TIMING_EVENTS,
    WEFT__TIMING_CUPTI,
    WEFT__TIMING_OFF,
} weft__gpu_timing;

weft__gpu_timing weft__cuda_gpu_timing(void);

/* ---- cuda_cupti.c ------------------------------------------------------ */

/* Start CUPTI's records if they are not on. false: CUPTI cannot time
 * operations (they go to the events; said once on stderr). */
bool weft__cupti_start(void);

/* Before an operation is enqueued: start CUPTI if need be and tag what the
 * calling thread enqueues next. false: CUPTI cannot time it (the operation
 * goes to the events). */
bool weft__cupti_tag(uint64_t *tag);

/* After it: stop tagging, and keep what the operation was for the record
 * that will come with its times. */
void weft__cupti_untag(weft__stream *s, uint64_t tag, const weft__op_info *op);

/* Report to tr every operation of its whose record CUPTI still holds, and
 * forget the rest of tr's; CUPTI stops once no trace has operations in
 * flight. */
void weft__cupti_flush(weft__trace *tr);

/* ---- cuda_engine.c ----------------------------------------------------- */

/* Look up the driver's stream memory operations; once per process. */
int weft__cuda_engine_load(void);

/* Set up and tear down a stream's share of the engine. */
void weft__cuda_engine_stream_init(weft__stream *s, unsigned slot);
void weft__cuda_engine_stream_fini(weft__stream *s);

int weft__cuda_mark(weft__stream *s, uint64_t *seq);
int weft__cuda_wait(weft__stream *s, uint64_t seq, uint64_t deadline);
int weft__cuda_stream_wait(weft__stream *s, weft__stream *other, uint64_t seq);
bool weft__cuda_reached(weft__stream *s, uint64_t seq); /* has s reached seq? */
unsigned weft__cuda_poll(weft__device *d);
bool weft__cuda_pending(weft__device *d);

#endif

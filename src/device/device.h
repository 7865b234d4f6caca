/*
 * device.h - the interface every device backend implements.
 *
 * A device executes streams: in-order queues of operations (copies, memsets,
 * host functions, and for GPUs kernels). A task leases a stream on its first
 * enqueue and gives it back once that work has completed, so independent
 * tasks do not queue behind each other while the pool lasts. Backends:
 * host.c (host threads) and, with CUDA, src/cuda/backend.c. The core never
 * branches on the backend; it calls through weft__device_ops.
 *
 * Backends know nothing of tasks' internals: to wait, they use the waiter
 * protocol of task/wait.h, which suspends a task or blocks a thread alike,
 * and a wait that would suspend the caller first asks
 * weft__task_may_suspend (graph regions forbid it).
 */
#ifndef WEFT_DEVICE_H
#define WEFT_DEVICE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/clock.h"
#include "core/lock.h"
#include "task/wait.h"
#include "trace/trace.h"
#include "weft.h"

typedef struct weft__device weft__device;
typedef struct weft__stream weft__stream;
typedef struct weft__device_stats weft__device_stats;

/* An operation as the timeline names it (trace/trace.h has the kinds). */
typedef struct weft__op_info {
    weft__op_kind kind;
    const void *kernel; /* WEFT__OP_KERNEL: the kernel launched */
    uint64_t bytes;     /* copies and memsets */
    uint64_t task;      /* the enqueuing task's trace id */
} weft__op_info;

typedef struct weft__device_ops {
    const char *name; /* "host", "cuda" */

    /* Wait for every stream to drain, then free the device. */
    void (*destroy)(weft__device *dev);

    /* Take a stream for one task's work; priority is a weft_priority. When
     * the pool is exhausted a backend may hand out a stream that is already
     * leased (shared, in order); it never fails for lack of streams. Returns
     * WEFT_OK or an error (WEFT_EDEVICE, WEFT_ENOMEM). */
    int (*stream_lease)(weft__device *dev, int priority, weft__stream **s);

    /* Give s back. Everything enqueued on it by this lease has completed. */
    void (*stream_return)(weft__device *dev, weft__stream *s);

    /* Streams leased now: the load that placement balances. */
    unsigned (*load)(weft__device *dev);

    /* Enqueue an operation; it runs after everything enqueued before it on
     * s. Errors found at enqueue time are returned (with the message set);
     * errors during execution are reported by the next wait. */
    int (*copy)(weft__stream *s, void *dst, const void *src, size_t n);
    int (*fill)(weft__stream *s, void *dst, int value, size_t n);
    int (*host_fn)(weft__stream *s, void (*fn)(void *arg), void *arg);
    int (*launch)(weft__stream *s, const void *kernel, weft_dim3 grid, weft_dim3 block,
                  size_t shared_bytes, void **args);
    int (*malloc_async)(weft__stream *s, void **ptr, size_t n);
    int (*free_async)(weft__stream *s, void *ptr);

    /* A point in s: *seq completes once everything enqueued on s before
     * this call has. Sequence numbers grow across leases. */
    int (*mark)(weft__stream *s, uint64_t *seq);

    /* Suspend the calling task (or block the calling thread) until s has
     * reached seq, or deadline (WEFT_FOREVER: none) has passed. Not
     * cancellable: work in flight may point into the caller's stack.
     * Returns WEFT_OK, WEFT_EDEVICE (message set) if the device failed, or
     * WEFT_ETIMEDOUT / WEFT_ENOMEM (no message) when the wait was withdrawn
     * (weft__wait_withdrawn): its waiter is unlinked again before return. */
    int (*wait)(weft__stream *s, uint64_t seq, uint64_t deadline);

    /* Make work enqueued on s from now on wait until other reaches seq. */
    int (*stream_wait)(weft__stream *s, weft__stream *other, uint64_t seq);

    /* The backend's own stream handle (a cudaStream_t), or NULL. */
    void *(*native)(weft__stream *s);

    /* Host memory for fast transfers; mapped: also addressable by the
     * device at *device_ptr. host_free (and free_async) give back only what
     * the backend handed out and has not taken back, and refuse anything
     * else with WEFT_EINVAL, a message naming call, without reading the
     * memory ptr points at: it need not be mapped. */
    int (*host_alloc)(weft__device *dev, void **ptr, size_t n, bool mapped, void **device_ptr);
    int (*host_free)(weft__device *dev, void *ptr, const char *call);

    /* Graph mode (NULL: the backend runs regions eagerly). region_begin
     * gives a stream that records instead of running: the region's work
     * goes there. region_end stops recording and launches the work on s as
     * one graph, cached under key; region_abandon stops and drops it.
     * region_replay launches an idle graph of key on s as it stands
     * (*replayed true), or does nothing (false: none to replay). */
    int (*region_begin)(weft__stream *s, weft__stream **capture);
    int (*region_end)(weft__stream *s, weft__stream *capture, uint64_t key);
    void (*region_abandon)(weft__stream *capture);
    int (*region_replay)(weft__stream *s, uint64_t key, bool *replayed);
    void (*graph_stats)(weft__device *dev, weft_graph_stats *sum);

    /* Add the device's counters for the run's diagnosis to *sum
     * (weft__device_stats below). NULL: it keeps none. */
    void (*stats)(weft__device *dev, weft__device_stats *sum);

    /* Completion engine, for backends whose work completes without a
     * thread of theirs noticing (NULL otherwise). poll fires what has
     * completed and returns how many waits it ended; it is cheap when
     * nothing is pending. pending says whether any wait is outstanding. */
    unsigned (*poll)(weft__device *dev);
    bool (*pending)(weft__device *dev);

    /* Timing operations for the timeline, while a trace is on (NULL: the
     * backend reports its operations itself as its threads run them).
     * trace_begin is called just before an operation of the given kind is
     * enqueued on s and returns what trace_end, called just after with
     * what it was, needs; the operation is reported once trace_collect
     * finds it complete, or, where it is timed by records the backend
     * receives later, as they come: trace_flush reports all of those
     * (before a recording session of the device's trace ends), and
     * trace_prepare, as a session starts, gets that timing ready (or the
     * first operation does). Called with a trace on only, never for
     * recorded (region) work. */
    void (*trace_prepare)(weft__device *dev);
    void *(*trace_begin)(weft__stream *s, weft__op_kind kind);
    void (*trace_end)(weft__stream *s, void *begin, const weft__op_info *op);
    void (*trace_collect)(weft__stream *s);
    void (*trace_flush)(weft__device *dev);
} weft__device_ops;

/* How long a device has had work outstanding: the union of the intervals
 * during which at least one of its streams held work not yet known to be
 * complete. A backend calls busy_begin when a stream goes from idle to
 * having work, busy_end when it is idle again (both cheap: once per
 * stretch of work on a stream, not per operation). */
typedef struct weft__busy {
    weft__lock lock;   /* a leaf: taken under stream locks, never around one */
    unsigned streams;  /* streams with work outstanding */
    uint64_t since_ns; /* when streams last went from 0 to 1 */
    uint64_t total_ns; /* closed intervals */
} weft__busy;

static inline void weft__busy_begin(weft__busy *b)
{
    weft__lock_acquire(&b->lock);
    if (b->streams++ == 0)
        b->since_ns = weft__now_ns();
    weft__lock_release(&b->lock);
}

static inline void weft__busy_end(weft__busy *b)
{
    weft__lock_acquire(&b->lock);
    if (--b->streams == 0)
        b->total_ns += weft__now_ns() - b->since_ns;
    weft__lock_release(&b->lock);
}

/* Busy time so far, counting an interval still open up to now. */
static inline uint64_t weft__busy_read(weft__busy *b)
{
    weft__lock_acquire(&b->lock);
    uint64_t ns = b->total_ns + (b->streams ? weft__now_ns() - b->since_ns : 0);
    weft__lock_release(&b->lock);
    return ns;
}

/* A device's counters for the run's diagnosis (src/report.c). Each
 * stream keeps its own (weft__stream_counts), written by the one task that
 * leases it and by the thread running its work: no counter is shared
 * between streams on the enqueue path. */
struct weft__device_stats {
    unsigned leases_max; /* most streams leased at once */
    uint64_t launches;   /* eager kernel launches */
    uint64_t copy_bytes[WEFT_COPY_KINDS];
    uint64_t copy_ns;       /* time copies ran, where the backend times them */
    uint64_t host_blocks;   /* pinned or mapped blocks not given back */
    uint64_t device_blocks; /* weft_malloc_async blocks on its streams, not freed */
};

typedef struct weft__stream_counts {
    atomic_uint_least64_t launches, copy_ns, allocs, frees;
    atomic_uint_least64_t copy_bytes[WEFT_COPY_KINDS];
} weft__stream_counts;

/* Add n to a counter of a stream: a relaxed load and store, no locked
 * instruction. Two tasks sharing a stream (the pool exhausted) may lose a
 * count; a figure for diagnosis tolerates that. */
static inline void weft__tally(atomic_uint_least64_t *c, uint64_t n)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

/* Add a stream's counts to a device's sum. */
static inline void weft__stream_counts_add(weft__stream_counts *c, weft__device_stats *sum)
{
    sum->launches += atomic_load_explicit(&c->launches, memory_order_relaxed);
    sum->copy_ns += atomic_load_explicit(&c->copy_ns, memory_order_relaxed);
    for (int k = 0; k < WEFT_COPY_KINDS; k++)
        sum->copy_bytes[k] += atomic_load_explicit(&c->copy_bytes[k], memory_order_relaxed);
    uint64_t allocs = atomic_load_explicit(&c->allocs, memory_order_relaxed);
    uint64_t frees = atomic_load_explicit(&c->frees, memory_order_relaxed);
    sum->device_blocks += allocs - frees; /* a block freed on another device's stream wraps */
}

/* Keep the most leases held at once, given the count just after a lease.
 * Written only when a new most is reached. */
static inline void weft__leases_note(atomic_uint *max, unsigned now)
{
    unsigned seen = atomic_load_explicit(max, memory_order_relaxed);
    while (now > seen && !atomic_compare_exchange_weak_explicit(
                             max, &seen, now, memory_order_relaxed, memory_order_relaxed))
        ;
}

struct weft__device {
    const weft__device_ops *ops;
    weft__busy busy;
    unsigned index;            /* position in the runtime's device table */
    struct weft__trace *trace; /* the runtime's timeline, set after creation */
    /* Set by the runtime for polled backends: when a wait starts and nobody
     * may be polling (say, every worker is asleep), this gets one going. */
    void (*kick)(void *ctx);
    void *kick_ctx;
};

/* ---- an operation's brackets while a trace is on (api.c) -------------- */

/* The timeline times an operation on the device (unless it is recorded
 * into a graph: the graph's launch is timed), and a profiler sees an NVTX
 * range named after the public call. Open just before the operation is
 * enqueued, close just after; only while weft__trace_on(). */
typedef struct weft__op_bracket {
    void *mark; /* the backend's trace_begin, for its trace_end */
    bool timed, nvtx;
} weft__op_bracket;

struct weft__task;
weft__op_bracket weft__op_bracket_open(struct weft__task *t, weft__stream *s, const char *call,
                                       weft__op_kind kind);
void weft__op_bracket_close(struct weft__task *t, weft__stream *s, weft__op_bracket b,
                            weft__op_info op);

/* The calling task and the stream its device work goes to now, leasing one
 * if needed (api.c). */
int weft__task_stream(const char *fn, struct weft__task **tp, weft__stream **sp);

/* Device work left unawaited when a task returns (api.c); the composition
 * root sets it as the task layer's task_exit hook. */
void weft__device_task_exit(struct weft__task *t);

/* Stop a task's open region and drop its work (region.c). */
void weft__region_drop(struct weft__task *t);

/* Wait for everything enqueued on s so far. */
static inline int weft__stream_sync(const weft__device_ops *ops, weft__stream *s)
{
    uint64_t seq;
    int rc = ops->mark(s, &seq);
    return rc ? rc : ops->wait(s, seq, WEFT_FOREVER);
}

/* The CUDA backend: one device per GPU. *count receives how many were
 * found; 0 (and WEFT_OK) when there is no GPU or no CUDA in this build. */
int weft__cuda_devices_create(weft__device ***devs, unsigned *count, unsigned graph_cache);

/* The host backend: streams executed by `threads` host threads (0: 2). Its
 * stream pool grows on demand up to WEFT__HOST_STREAMS_MAX streams; beyond
 * that, a lease shares the stream with the fewest leases. */
#define WEFT__HOST_STREAMS_MAX 1024
int weft__host_device_create(weft__device **dev, unsigned threads);

#endif

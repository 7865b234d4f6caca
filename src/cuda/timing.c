/*
 * timing.c - timing GPU operations for the timeline, with CUDA events.
 *
 * While a trace records, each operation a task enqueues is bracketed by two
 * timing events recorded on its stream (trace_begin, trace_end), and queued
 * on the stream with the marker that will cover it (the stream's next
 * sequence number). Operations enqueued back to back share events: one's
 * end is the next one's start (chained), so a run of n operations costs
 * n + 1 event records, not 2n - each a driver call of microseconds, more
 * when threads contend for the driver. Nothing waits for them: when the
 * task's await has seen that marker complete, trace_collect reads the
 * events back and reports the operations. Events come from, and go back
 * to, a spare list per stream.
 *
 * Device time to host time. cudaEventElapsedTime measures between two
 * events only, so each device has an anchor: an event whose host time is
 * known. The first one is recorded on an idle stream of its own and polled
 * until done (once per device, the only waits this file makes); its host time
 * is the middle of the record-to-seen interval, the narrowest of a few
 * tries, usually a few microseconds wide.
 * Each event is measured from the anchor once: a chained operation starts
 * at the host time its predecessor's end was given, so a run of n
 * operations costs n + 1 elapsed-time calls. Operations are read back in
 * stream order under the stream's lock, which keeps that predecessor's time
 * at hand. Elapsed times are floats in milliseconds, precise to a few
 * nanoseconds up to ANCHOR_MS: an operation's end read back further than
 * that from the anchor becomes the new anchor, its host time carried over,
 * so precision holds over traces of any length; after a long idle spell
 * (REANCHOR_MS) the anchor is measured anew instead.
 *
 * That is the way with WEFT_TRACE_GPU=events. By default CUPTI's records
 * time the copies, memsets, kernels and graphs (cupti.c), costing a
 * pipeline about half as much, and events only host functions, which leave
 * no record; with WEFT_TRACE_GPU=off no operation is timed, and the trace
 * holds the tasks and their waits.
 */
#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "cuda/backend.h"

enum {
    COLLECT_BATCH = 32,
    ANCHOR_MS = 100,             /* an operation ending this far from the anchor becomes it */
    REANCHOR_MS = 10000,         /* this far (the device idle for long): measure anew */
    ANCHOR_WAIT_NS = 1000000000, /* give up anchoring after this */
    ANCHOR_TRIES = 8,            /* anchor windows measured, the narrowest kept */
    ANCHOR_NARROW_NS = 10000,    /* a window this narrow is kept at once */
    KERNEL_NAMES = 256,          /* kernels whose names are kept (a power of two) */
};

typedef struct weft__cuda_timed {
    cudaEvent_t start; /* NULL: chained, it starts where the previous operation ended */
    cudaEvent_t end;
    uint64_t seq; /* complete once the stream reaches this marker */
    weft__op_info op;
} timed;

weft__gpu_timing weft__cuda_gpu_timing(void)
{
    static atomic_int timing = -1;
    int t = atomic_load_explicit(&timing, memory_order_relaxed);
    if (t < 0) {
        const char *v = getenv("WEFT_TRACE_GPU");
        t = WEFT__TIMING_CUPTI;
        if (v && strcmp(v, "events") == 0)
            t = WEFT__TIMING_EVENTS;
        else if (v && strcmp(v, "off") == 0)
            t = WEFT__TIMING_OFF;
        else if (v && *v && strcmp(v, "cupti") != 0)
            fprintf(stderr, "weft: WEFT_TRACE_GPU=%s: not cupti, events or off; using cupti\n", v);
        atomic_store_explicit(&timing, t, memory_order_relaxed);
    }
    return (weft__gpu_timing)t;
}

/* ---- timing events --------------------------------------------------------- */

/* A spare event of s, or NULL. Call with s->lock held. */
static cudaEvent_t spare_take(weft__stream *s)
{
    return s->timing.ntiming_spare > 0 ? s->timing.timing_spare[--s->timing.ntiming_spare] : NULL;
}

/* Keep ev for recording again. Call with s->lock held. */
static void spare_give(weft__stream *s, cudaEvent_t ev)
{
    if (s->timing.ntiming_spare == s->timing.timing_spare_cap) {
        unsigned cap = s->timing.timing_spare_cap ? 2 * s->timing.timing_spare_cap : 16;
        cudaEvent_t *spare = realloc(s->timing.timing_spare, cap * sizeof *spare);
        if (!spare) {
            cudaEventDestroy(ev);
            return;
        }
        s->timing.timing_spare = spare;
        s->timing.timing_spare_cap = cap;
    }
    s->timing.timing_spare[s->timing.ntiming_spare++] = ev;
}

static void event_put(weft__stream *s, cudaEvent_t ev)
{
    weft__lock_acquire(&s->lock);
    spare_give(s, ev);
    weft__lock_release(&s->lock);
}

/* ev (a spare, or NULL for a new one) recorded on s now, or NULL: the
 * operation goes untimed. */
static cudaEvent_t record(weft__stream *s, cudaEvent_t ev)
{
    if (!ev && cudaEventCreate(&ev) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (cudaEventRecord(ev, s->handle) != cudaSuccess) {
        cudaGetLastError();
        event_put(s, ev);
        return NULL;
    }
    return ev;
}

/* ---- bracketing operations ------------------------------------------------- */

/* The newest timed operation's end, or NULL. Call with s->lock held. */
static cudaEvent_t newest_end(const weft__stream *s)
{
    if (s->timing.timed_count == 0)
        return NULL;
    return s->timing.timed[(s->timing.timed_head + s->timing.timed_count - 1) % s->timing.timed_cap]
        .end;
}

/* What trace_begin hands trace_end: the event the operation starts from,
 * its low bit set when that is the newest timed operation's end (chained:
 * that operation owns the event); or, for an operation CUPTI times, its
 * tag shifted past the two low bits, TAGGED set. Events are driver
 * objects, aligned. */
#define CHAINED ((uintptr_t)1)
#define TAGGED ((uintptr_t)2)

void *weft__cuda_trace_begin(weft__stream *s, weft__op_kind kind)
{
    uint64_t tag;
    weft__gpu_timing timing = weft__cuda_gpu_timing();
    if (timing == WEFT__TIMING_OFF || weft__cuda_use_device(s->dev) != WEFT_OK)
        return NULL;
    /* host functions leave no record of their own: events time them */
    if (kind != WEFT__OP_HOST_FN && timing == WEFT__TIMING_CUPTI && weft__cupti_tag(&tag))
        return (void *)((uintptr_t)tag << 2 | TAGGED);
    weft__lock_acquire(&s->lock);
    cudaEvent_t chained = s->timing.timing_chain ? newest_end(s) : NULL;
    cudaEvent_t spare = chained ? NULL : spare_take(s);
    weft__lock_release(&s->lock);
    if (chained)
        return (void *)((uintptr_t)chained | CHAINED);
    cudaEvent_t start = record(s, spare);
    assert(((uintptr_t)start & CHAINED) == 0);
    return start;
}

/* Room for one more timed operation. Call with s->lock held. */
static bool timed_reserve(weft__stream *s)
{
    if (s->timing.timed_count < s->timing.timed_cap)
        return true;
    unsigned cap = s->timing.timed_cap ? 2 * s->timing.timed_cap : 32;
    timed *ring = malloc(cap * sizeof *ring);
    if (!ring)
        return false;
    for (unsigned i = 0; i < s->timing.timed_count; i++)
        ring[i] = s->timing.timed[(s->timing.timed_head + i) % s->timing.timed_cap];
    free(s->timing.timed);
    s->timing.timed = ring;
    s->timing.timed_head = 0;
    s->timing.timed_cap = cap;
    return true;
}

void weft__cuda_trace_end(weft__stream *s, void *begin, const weft__op_info *op)
{
    if ((uintptr_t)begin & TAGGED) {
        weft__cupti_untag(s, (uintptr_t)begin >> 2, op);
        return;
    }
    bool chained = (uintptr_t)begin & CHAINED;
    cudaEvent_t start = (cudaEvent_t)((uintptr_t)begin & ~CHAINED), end;
    if (!start)
        return;
    weft__lock_acquire(&s->lock);
    cudaEvent_t spare = spare_take(s);
    weft__lock_release(&s->lock);
    end = record(s, spare);
    weft__lock_acquire(&s->lock);
    /* A chain holds if start is still the newest end: no other timed
     * operation was queued since (leases that share a stream) nor read
     * back. */
    bool queued = end && (!chained || start == newest_end(s)) && timed_reserve(s);
    if (queued) /* markers after this one are enqueued after both events */
        s->timing.timed[(s->timing.timed_head + s->timing.timed_count++) % s->timing.timed_cap] =
            (timed){.start = chained ? NULL : start, .end = end, .seq = s->marked + 1, .op = *op};
    else {
        if (!chained)
            spare_give(s, start);
        if (end)
            spare_give(s, end);
    }
    s->timing.timing_chain = queued;
    weft__lock_release(&s->lock);
}

/* ---- reading back ---------------------------------------------------------- */

/* Record ev on the anchor stream and poll until it is done: *before and
 * *seen bound its device time, by the host's clock. */
static bool anchor_try(weft__cuda_device *dev, cudaEvent_t ev, uint64_t *before, uint64_t *seen)
{
    *before = weft__now_ns();
    cudaError_t e = cudaEventRecord(ev, dev->timing.anchor_stream);
    if (e == cudaSuccess) /* poll until it is done (or, improbably, the time is up) */
        while ((e = cudaEventQuery(ev)) == cudaErrorNotReady &&
               weft__now_ns() - *before < ANCHOR_WAIT_NS)
            ;
    *seen = weft__now_ns();
    if (e != cudaSuccess)
        cudaGetLastError();
    return e == cudaSuccess;
}

/* Record an anchor and measure its host time: the middle of the narrowest
 * of a few record-to-seen windows. A window can be hundreds of microseconds
 * wide when the record waits for the driver (a stream's first use, threads
 * launching), and half of it is the anchor's error. Call with anchor_lock
 * held. */
static bool anchor_create(weft__cuda_device *dev)
{
    cudaEvent_t ev[2];
    if (dev->timing.anchor) {
        cudaEventDestroy(dev->timing.anchor);
        dev->timing.anchor = NULL;
    }
    if (weft__cuda_use_device(dev) != WEFT_OK)
        return false;
    if (!dev->timing.anchor_stream &&
        cudaStreamCreateWithFlags(&dev->timing.anchor_stream, cudaStreamNonBlocking) !=
            cudaSuccess) {
        dev->timing.anchor_stream = NULL;
        cudaGetLastError();
        return false;
    }
    if (cudaEventCreate(&ev[0]) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (cudaEventCreate(&ev[1]) != cudaSuccess) {
        cudaGetLastError();
        cudaEventDestroy(ev[0]);
        return false;
    }
    uint64_t best = UINT64_MAX, best_ns = 0, before, seen;
    unsigned kept = 0; /* ev[kept] holds the best window's record */
    for (int i = 0; i < ANCHOR_TRIES && best > ANCHOR_NARROW_NS; i++) {
        unsigned trial = best == UINT64_MAX ? kept : 1 - kept;
        if (!anchor_try(dev, ev[trial], &before, &seen))
            break;
        if (seen - before < best) {
            best = seen - before;
            best_ns = before + best / 2;
            kept = trial;
        }
    }
    cudaEventDestroy(ev[1 - kept]);
    if (best == UINT64_MAX) {
        cudaEventDestroy(ev[kept]);
        return false;
    }
    dev->timing.anchor = ev[kept];
    dev->timing.anchor_ns = best_ns;
    return true;
}

/* ms from the anchor to ev, measured anew when the anchor is too far. Call
 * with anchor_lock held. */
static bool from_anchor(weft__cuda_device *dev, cudaEvent_t ev, float *ms)
{
    if (!dev->timing.anchor && !anchor_create(dev))
        return false;
    if (cudaEventElapsedTime(ms, dev->timing.anchor, ev) != cudaSuccess)
        return false;
    if (fabsf(*ms) <= REANCHOR_MS) /* farther, floats are coarse */
        return true;
    return anchor_create(dev) && cudaEventElapsedTime(ms, dev->timing.anchor, ev) == cudaSuccess;
}

static uint64_t host_time(const weft__cuda_device *dev, float ms)
{
    return dev->timing.anchor_ns + (uint64_t)llround((double)ms * 1e6);
}

/* Host times of op, in stream order: a chained op starts at the host time
 * its predecessor's end was given (s->timing.timed_end_ns). *ok: the times are
 * known. Returns true when op->end became the new anchor: then the caller
 * must not reuse it. Call with s->lock and anchor_lock held. */
static bool host_times(weft__stream *s, const timed *op, uint64_t *start, uint64_t *end, bool *ok)
{
    weft__cuda_device *dev = s->dev;
    float ms_start = 0, ms_end;
    bool after_known = s->timing.timed_end_known;
    bool measured = from_anchor(dev, op->end, &ms_end) &&
                    (!op->start ||
                     cudaEventElapsedTime(&ms_start, dev->timing.anchor, op->start) == cudaSuccess);
    cudaGetLastError();
    *ok = measured && (op->start || after_known);
    s->timing.timed_end_known = measured;
    if (!measured)
        return false;
    *end = host_time(dev, ms_end);
    *start = op->start ? host_time(dev, ms_start) : s->timing.timed_end_ns;
    if (*start > *end)
        *start = *end;
    s->timing.timed_end_ns = *end;
    if (fabsf(ms_end) <= ANCHOR_MS)
        return false;
    cudaEventDestroy(dev->timing.anchor);
    dev->timing.anchor = op->end;
    dev->timing.anchor_ns = *end;
    return true;
}

/* A kernel's name without its C++ mangling, for the common shapes: a
 * plain name (_Z5k_mixPjjjj: k_mix), one of internal linkage (_ZL4stepv:
 * step), a nested one (_ZN2ns4blurEPf: blur, the last component). Else the
 * name as given. */
const char *weft__cuda_demangle(const char *name, char *buf, size_t size)
{
    if (strncmp(name, "_Z", 2) != 0)
        return name;
    const char *p = name + 2, *last = NULL;
    size_t last_len = 0;
    if (*p == 'L')
        p++;
    bool nested = *p == 'N';
    p += nested;
    while (*p >= '1' && *p <= '9') { /* <length><identifier>, repeated when nested */
        char *rest;
        unsigned long len = strtoul(p, &rest, 10);
        if (strlen(rest) < len)
            return name;
        last = rest;
        last_len = len;
        p = rest + len;
        if (!nested)
            break;
    }
    if (!last || last_len >= size)
        return name;
    memcpy(buf, last, last_len);
    buf[last_len] = '\0';
    return buf;
}

static const char *demangled(const void *kernel, char *buf, size_t size)
{
    const char *name = NULL;
    if (!kernel || cudaFuncGetName(&name, kernel) != cudaSuccess || !name) {
        cudaGetLastError();
        return "kernel";
    }
    return weft__cuda_demangle(name, buf, size);
}

/* Kernel names, looked up and demangled once per kernel (kernels live as
 * long as the process). An open-addressed table read without locks: the
 * thread that claims a free slot writes the name, then publishes the
 * kernel; a reader that meets a slot still being written does not wait
 * but works the name out itself. */
static struct kernel_slot {
    _Atomic(const void *) kernel; /* set once name is written */
    atomic_bool claimed;
    char name[WEFT__TRACE_NAME];
} kernel_names[KERNEL_NAMES];

const char *weft__cuda_kernel_name(const void *kernel, char *buf, size_t size)
{
    size_t h = (size_t)(((uintptr_t)kernel >> 4) * 0x9e3779b97f4a7c15u >> 32);
    for (size_t i = 0; i < KERNEL_NAMES; i++) {
        struct kernel_slot *slot = &kernel_names[(h + i) % KERNEL_NAMES];
        const void *k = atomic_load_explicit(&slot->kernel, memory_order_acquire);
        if (k == kernel)
            return slot->name;
        if (k)
            continue;
        if (atomic_exchange_explicit(&slot->claimed, true, memory_order_relaxed))
            break; /* being written, maybe for this kernel */
        weft__trace_copy_name(slot->name, demangled(kernel, buf, size));
        atomic_store_explicit(&slot->kernel, kernel, memory_order_release);
        return slot->name;
    }
    return demangled(kernel, buf, size); /* full, or busy: not kept */
}

typedef struct read_back {
    timed op;
    uint64_t start, end;
} read_back;

static void report(weft__trace *tr, weft__stream *s, const read_back *r)
{
    char buf[64];
    const char *name = r->op.op.kind == WEFT__OP_KERNEL
                           ? weft__cuda_kernel_name(r->op.op.kernel, buf, sizeof buf)
                           : NULL;
    weft__trace_op(tr, s->dev->base.index, weft__cuda_stream_index(s), r->op.op.kind, name,
                   r->op.op.bytes, r->op.op.task, r->start, r->end);
}

/* Read back the complete operations at the head of the ring, up to a batch,
 * their events going back to the spares; n: how many were taken off. */
static unsigned read_batch(weft__stream *s, bool recording, read_back *done, unsigned *n)
{
    weft__cuda_device *dev = s->dev;
    unsigned taken = 0;
    *n = 0;
    weft__lock_acquire(&s->lock);
    if (recording)
        weft__lock_acquire(&dev->timing.anchor_lock);
    while (taken < COLLECT_BATCH && s->timing.timed_count > 0) {
        timed *op = &s->timing.timed[s->timing.timed_head];
        if (!weft__cuda_reached(s, op->seq))
            break;
        read_back *r = &done[*n];
        bool ok = false, kept = recording && host_times(s, op, &r->start, &r->end, &ok);
        if (ok)
            r->op = *op, ++*n;
        if (!recording)
            s->timing.timed_end_known = false;
        if (op->start)
            spare_give(s, op->start);
        if (!kept)
            spare_give(s, op->end);
        s->timing.timed_head = (s->timing.timed_head + 1) % s->timing.timed_cap;
        s->timing.timed_count--;
        taken++;
    }
    if (recording)
        weft__lock_release(&dev->timing.anchor_lock);
    weft__lock_release(&s->lock);
    return taken;
}

void weft__cuda_trace_collect(weft__stream *s)
{
    weft__trace *tr = s->dev->base.trace;
    read_back done[COLLECT_BATCH];
    unsigned taken, n;
    do {
        taken = read_batch(s, tr && weft__trace_recording(tr), done, &n);
        for (unsigned i = 0; i < n; i++)
            report(tr, s, &done[i]);
    } while (taken == COLLECT_BATCH);
}

void weft__cuda_trace_stream_fini(weft__stream *s)
{
    for (unsigned i = 0; i < s->timing.timed_count; i++) {
        timed *op = &s->timing.timed[(s->timing.timed_head + i) % s->timing.timed_cap];
        if (op->start) /* else it is the previous one's end */
            cudaEventDestroy(op->start);
        cudaEventDestroy(op->end);
    }
    for (unsigned i = 0; i < s->timing.ntiming_spare; i++)
        cudaEventDestroy(s->timing.timing_spare[i]);
    free(s->timing.timed);
    free(s->timing.timing_spare);
    s->timing.timed = NULL;
    s->timing.timing_spare = NULL;
    s->timing.timed_count = s->timing.ntiming_spare = 0;
}

void weft__cuda_trace_prepare(weft__device *dev)
{
    (void)dev;
    if (weft__cuda_gpu_timing() == WEFT__TIMING_CUPTI)
        weft__cupti_start();
}

void weft__cuda_trace_flush(weft__device *dev)
{
    if (weft__cuda_gpu_timing() == WEFT__TIMING_CUPTI)
        weft__cupti_flush(dev->trace);
}

void weft__cuda_trace_fini(weft__cuda_device *dev)
{
    weft__cuda_trace_flush(&dev->base);
    if (dev->timing.anchor)
        cudaEventDestroy(dev->timing.anchor);
    if (dev->timing.anchor_stream)
        cudaStreamDestroy(dev->timing.anchor_stream);
    dev->timing.anchor = NULL;
    dev->timing.anchor_stream = NULL;
}

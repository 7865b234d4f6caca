/*
 * cuda_trace.c - timing GPU operations for the timeline, with CUDA events.
 *
 * While a trace records, each operation a task enqueues is bracketed by two
 * timing events recorded on its stream (trace_begin, trace_end), and queued
 * on the stream with the marker that will cover it (the stream's next
 * sequence number). Operations enqueued back to back share events: one's
 * end is the next one's start (chained), so a run of n operations costs
 * n + 1 event records, not 2n - each a driver call of microseconds. Nothing waits for them: when the task's await has seen
 * that marker complete, trace_collect reads the events back and reports the
 * operation. Events come from, and go back to, a spare list per stream.
 *
 * Device time to host time. cudaEventElapsedTime measures between two
 * events only, so each device has an anchor: an event whose host time is
 * known. The first one is recorded on an idle stream of its own and polled
 * until done (once per device, the only wait this file makes); its host time
 * is the middle of the record-to-seen interval, a few microseconds wide.
 * Elapsed times are floats in milliseconds, precise to well under a
 * microsecond up to a second or so: an operation read back more than
 * ANCHOR_MS from the anchor becomes the new anchor, its host time carried
 * over, so precision holds over traces of any length; after a long idle
 * spell (REANCHOR_MS) the anchor is measured anew instead.
 */
#ifdef WEFT_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "device/cuda_internal.h"

enum {
    COLLECT_BATCH = 32,
    ANCHOR_MS = 1000,       /* an operation this far from the anchor becomes it */
    REANCHOR_MS = 10000,    /* this far (the device idle for long): measure anew */
    ANCHOR_WAIT_NS = 1000000000, /* give up anchoring after this */
};

typedef struct weft__cuda_timed {
    cudaEvent_t start, end;
    bool chained; /* start is the previous operation's end, which that one owns */
    uint64_t seq; /* complete once the stream reaches this marker */
    weft__op_info op;
} timed;

/* ---- timing events --------------------------------------------------------- */

static cudaEvent_t event_get(weft__stream *s)
{
    cudaEvent_t ev = NULL;
    weft__lock_acquire(&s->lock);
    if (s->ntiming_spare > 0)
        ev = s->timing_spare[--s->ntiming_spare];
    weft__lock_release(&s->lock);
    if (!ev && cudaEventCreate(&ev) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return ev;
}

static void event_put(weft__stream *s, cudaEvent_t ev)
{
    weft__lock_acquire(&s->lock);
    if (s->ntiming_spare == s->timing_spare_cap) {
        unsigned cap = s->timing_spare_cap ? 2 * s->timing_spare_cap : 16;
        cudaEvent_t *spare = realloc(s->timing_spare, cap * sizeof *spare);
        if (!spare) {
            weft__lock_release(&s->lock);
            cudaEventDestroy(ev);
            return;
        }
        s->timing_spare = spare;
        s->timing_spare_cap = cap;
    }
    s->timing_spare[s->ntiming_spare++] = ev;
    weft__lock_release(&s->lock);
}

/* An event recorded on s now, or NULL (the operation goes untimed). */
static cudaEvent_t record(weft__stream *s)
{
    cudaEvent_t ev = event_get(s);
    if (ev && cudaEventRecord(ev, s->handle) != cudaSuccess) {
        cudaGetLastError();
        event_put(s, ev);
        ev = NULL;
    }
    return ev;
}

/* ---- bracketing operations ------------------------------------------------- */

/* The newest timed operation's end, if nothing was enqueued since. Call
 * with s->lock held. */
static cudaEvent_t chain_from(weft__stream *s)
{
    if (!s->timing_chain || s->timed_count == 0)
        return NULL;
    return s->timed[(s->timed_head + s->timed_count - 1) % s->timed_cap].end;
}

void *weft__cuda_trace_begin(weft__stream *s)
{
    if (weft__cuda_use_device(s->dev) != WEFT_OK)
        return NULL;
    weft__lock_acquire(&s->lock);
    cudaEvent_t start = s->chained_start = chain_from(s);
    weft__lock_release(&s->lock);
    return start ? start : record(s);
}

/* Room for one more timed operation. Call with s->lock held. */
static bool timed_reserve(weft__stream *s)
{
    if (s->timed_count < s->timed_cap)
        return true;
    unsigned cap = s->timed_cap ? 2 * s->timed_cap : 32;
    timed *ring = malloc(cap * sizeof *ring);
    if (!ring)
        return false;
    for (unsigned i = 0; i < s->timed_count; i++)
        ring[i] = s->timed[(s->timed_head + i) % s->timed_cap];
    free(s->timed);
    s->timed = ring;
    s->timed_head = 0;
    s->timed_cap = cap;
    return true;
}

void weft__cuda_trace_end(weft__stream *s, void *begin, const weft__op_info *op)
{
    cudaEvent_t start = begin, end;
    if (!start)
        return;
    weft__lock_acquire(&s->lock);
    bool chained = start == s->chained_start; /* then the previous operation owns it */
    s->chained_start = NULL;
    weft__lock_release(&s->lock);
    if (!(end = record(s))) {
        if (!chained)
            event_put(s, start);
        s->timing_chain = false;
        return;
    }
    weft__lock_acquire(&s->lock);
    bool queued = timed_reserve(s);
    if (queued) /* markers after this one are enqueued after both events */
        s->timed[(s->timed_head + s->timed_count++) % s->timed_cap] =
            (timed){.start = start, .end = end, .chained = chained, .seq = s->marked + 1,
                    .op = *op};
    s->timing_chain = queued;
    weft__lock_release(&s->lock);
    if (!queued) {
        if (!chained)
            event_put(s, start);
        event_put(s, end);
    }
}

/* ---- reading back ---------------------------------------------------------- */

/* Record an anchor and measure its host time. Call with anchor_lock held. */
static bool anchor_create(weft__cuda_device *dev)
{
    cudaEvent_t ev;
    if (dev->anchor) {
        cudaEventDestroy(dev->anchor);
        dev->anchor = NULL;
    }
    if (weft__cuda_use_device(dev) != WEFT_OK)
        return false;
    if (!dev->anchor_stream &&
        cudaStreamCreateWithFlags(&dev->anchor_stream, cudaStreamNonBlocking) != cudaSuccess) {
        dev->anchor_stream = NULL;
        cudaGetLastError();
        return false;
    }
    if (cudaEventCreate(&ev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    uint64_t before = weft__now_ns(), seen;
    cudaError_t e = cudaEventRecord(ev, dev->anchor_stream);
    if (e == cudaSuccess) /* poll until it is done (or, improbably, the time is up) */
        while ((e = cudaEventQuery(ev)) == cudaErrorNotReady &&
               weft__now_ns() - before < ANCHOR_WAIT_NS)
            ;
    seen = weft__now_ns();
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaEventDestroy(ev);
        return false;
    }
    dev->anchor = ev;
    dev->anchor_ns = before + (seen - before) / 2;
    return true;
}

/* Host times of op's events. May keep op->start as the new anchor (then
 * *kept is set and the caller must not reuse it). */
static bool host_times(weft__cuda_device *dev, const timed *op, uint64_t *start, uint64_t *end,
                       bool *kept)
{
    float from_anchor, length;
    bool ok = false;
    *kept = false;
    weft__lock_acquire(&dev->anchor_lock);
    bool anchored = dev->anchor || anchor_create(dev);
    if (anchored && cudaEventElapsedTime(&from_anchor, dev->anchor, op->start) == cudaSuccess &&
        fabsf(from_anchor) > REANCHOR_MS) /* floats this large are coarse: measure anew */
        anchored = anchor_create(dev);
    if (anchored && cudaEventElapsedTime(&from_anchor, dev->anchor, op->start) == cudaSuccess &&
        cudaEventElapsedTime(&length, op->start, op->end) == cudaSuccess) {
        *start = dev->anchor_ns + (uint64_t)llroundf(from_anchor * 1e6f);
        *end = *start + (length > 0 ? (uint64_t)llroundf(length * 1e6f) : 0);
        if (fabsf(from_anchor) > ANCHOR_MS && !op->chained) {
            cudaEventDestroy(dev->anchor);
            dev->anchor = op->start;
            dev->anchor_ns = *start;
            *kept = true;
        }
        ok = true;
    }
    cudaGetLastError();
    weft__lock_release(&dev->anchor_lock);
    return ok;
}

/* A kernel's name without its C++ mangling, for the common shapes: a
 * plain name (_Z5k_mixPjjjj: k_mix), one of internal linkage (_ZL4stepv:
 * step), a nested one (_ZN2ns4blurEPf: blur, the last component). Else the
 * name as CUDA gives it. */
static const char *kernel_name(const void *kernel, char *buf, size_t size)
{
    const char *name = NULL;
    if (!kernel || cudaFuncGetName(&name, kernel) != cudaSuccess || !name) {
        cudaGetLastError();
        return "kernel";
    }
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

/* The stream's place in the device's pool: its track in the timeline. */
static unsigned stream_index(const weft__stream *s)
{
    return (unsigned)((s->flag - s->dev->flags) / WEFT__CUDA_FLAG_STRIDE);
}

static void report(weft__stream *s, const timed *op)
{
    weft__cuda_device *dev = s->dev;
    weft__trace *tr = dev->base.trace;
    uint64_t start, end;
    bool kept = false;
    if (tr && weft__trace_recording(tr) && host_times(dev, op, &start, &end, &kept)) {
        char buf[64];
        const char *name = op->op.kind == WEFT__OP_KERNEL
                               ? kernel_name(op->op.kernel, buf, sizeof buf)
                               : NULL;
        weft__trace_op(tr, dev->base.index, stream_index(s), op->op.kind, name, op->op.bytes,
                       op->op.task, start, end);
    }
    if (!kept && !op->chained)
        event_put(s, op->start);
    event_put(s, op->end);
}

void weft__cuda_trace_collect(weft__stream *s)
{
    timed done[COLLECT_BATCH];
    unsigned n;
    do {
        n = 0;
        weft__lock_acquire(&s->lock);
        while (n < COLLECT_BATCH && s->timed_count > 0) {
            timed *op = &s->timed[s->timed_head];
            if (!weft__cuda_reached(s, op->seq))
                break;
            done[n++] = *op;
            s->timed_head = (s->timed_head + 1) % s->timed_cap;
            s->timed_count--;
        }
        weft__lock_release(&s->lock);
        for (unsigned i = 0; i < n; i++)
            report(s, &done[i]);
    } while (n == COLLECT_BATCH);
}

void weft__cuda_trace_stream_fini(weft__stream *s)
{
    for (unsigned i = 0; i < s->timed_count; i++) {
        timed *op = &s->timed[(s->timed_head + i) % s->timed_cap];
        if (!op->chained) /* else it is the previous one's end */
            cudaEventDestroy(op->start);
        cudaEventDestroy(op->end);
    }
    for (unsigned i = 0; i < s->ntiming_spare; i++)
        cudaEventDestroy(s->timing_spare[i]);
    free(s->timed);
    free(s->timing_spare);
    s->timed = NULL;
    s->timing_spare = NULL;
    s->timed_count = s->ntiming_spare = 0;
}

void weft__cuda_trace_fini(weft__cuda_device *dev)
{
    if (dev->anchor)
        cudaEventDestroy(dev->anchor);
    if (dev->anchor_stream)
        cudaStreamDestroy(dev->anchor_stream);
    dev->anchor = NULL;
    dev->anchor_stream = NULL;
}

#endif

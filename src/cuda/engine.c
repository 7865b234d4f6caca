/*
 * engine.c - the completion engine of the CUDA backend.
 *
 * A marker is a point in a stream, numbered in order (1, 2, ...); a wait is
 * a waiter parked on the stream's FIFO until the stream's "done" number
 * reaches its marker. Markers on a stream complete in order, so the engine
 * looks at the first waiter of each active stream only.
 *
 * How "done" is known depends on the device's completion mode:
 *  - FLAG: cuStreamWriteValue32 writes the number into the
 *    stream's word of mapped host memory, after a memory fence, once all
 *    work before it is done. Reading it is a plain load.
 *  - EVENT: a CUDA event is recorded per marker; the engine queries the
 *    oldest one of each stream.
 *  - CALLBACK: a host function per marker runs on CUDA's callback thread
 *    when the work before it is done, and fires the waiters itself.
 *  - AUTO, the default: each marker is a flag or an event. Flags resume a
 *    lone waiter soonest and cost nothing to check, but each comes behind a
 *    fence, and with many streams completing often the fences hold the GPU
 *    back (bench/RESULTS.md); events cost the GPU nothing and the CPU a
 *    query, a driver call that contends with every thread's launches and
 *    allocations. So markers are events while the last window of the
 *    pollers' count saw CROWD_STREAMS streams active and CROWD_RATE
 *    completions a second, flags otherwise. The fences cost more than the
 *    queries only at rates where the GPU does little per marker (the graph
 *    pipeline at 5 us of host work, over 30,000 a second); at 10,000 to
 *    25,000 a second (weft-images at 16 workers, the pipeline at 20 us)
 *    events lost to flags by 17 to 21%. A stream has reached seq when its
 *    word has (and a flag was marked at or after seq) or its events have.
 * The engine runs in whoever polls: idle workers, and a watcher while every
 * worker would otherwise sleep (sched.c). A flag costs a load to check, an
 * event a driver call that contends with launches: so with events a poll
 * goes round the active streams from where the last one stopped and stops
 * after EVENT_MISSES streams whose events are not yet done, and only every
 * SWEEP_NS does it query them all.
 *
 * Faults silence all three: after a sticky error nothing more completes. So
 * while waits are pending, every BACKSTOP_NS the engine queries a few active
 * streams in turn; a sticky error marks the device failed and ends every
 * wait with WEFT_EDEVICE. (A stream still running can answer "not ready"
 * for seconds after another faulted, which is why it queries several.)
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/error.h"
#include "cuda/backend.h"
#include "task/task.h"

enum {
    BACKSTOP_NS = 10000000,   /* fault check period while waits are pending */
    BACKSTOP_QUERIES = 16,    /* streams queried per period */
    EVENT_MISSES = 2,         /* EVENT, AUTO: not-done events a poll queries */
    SWEEP_NS = 100000,        /* EVENT, AUTO: every active stream queried this often */
    RATE_WINDOW_NS = 1000000, /* AUTO: completions counted over windows this long */
    CROWD_STREAMS = 4,        /* AUTO: markers are events with this many streams active */
    CROWD_RATE = 30000,       /* ... firing this many waiters a second */
};

typedef CUresult (*stream_mem_op_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

static stream_mem_op_fn write_value, wait_value;

/* A wait for a stream to reach a sequence number; on the waiter's stack. */
typedef struct marker {
    weft__waiter w;
    uint64_t seq;
} marker;

int weft__cuda_engine_load(void)
{
    enum cudaDriverEntryPointQueryResult found;
    if (write_value && wait_value)
        return WEFT_OK;
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", (void **)&write_value, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess ||
        cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", (void **)&wait_value, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return weft__fail(WEFT_EDEVICE, "weft: the CUDA driver has no stream memory operations");
    }
    return WEFT_OK;
}

void weft__cuda_engine_stream_init(weft__stream *s, unsigned slot)
{
    weft__cuda_device *dev = s->dev;
    s->engine.flag = dev->engine.flags + slot * WEFT__CUDA_FLAG_STRIDE;
    s->engine.flag_device =
        dev->engine.flags_device + slot * WEFT__CUDA_FLAG_STRIDE * sizeof(uint32_t);
    atomic_init(&s->engine.done, 0);
    atomic_init(&s->engine.flag_marked, 0);
}

void weft__cuda_engine_stream_fini(weft__stream *s)
{
    for (unsigned i = 0; i < s->engine.ev_count; i++)
        cudaEventDestroy(s->engine.events[(s->engine.ev_head + i) % s->engine.ev_cap].event);
    for (unsigned i = 0; i < s->engine.nspare; i++)
        cudaEventDestroy(s->engine.spare[i]);
    free(s->engine.events);
    free(s->engine.spare);
}

/* ---- how far a stream has got ------------------------------------------ */

/* Has s's word reached seq? Compared cyclically on 32 bits, as the GPU's
 * own waits do. */
static bool flag_reached(const weft__stream *s, uint64_t seq)
{
    uint32_t done = __atomic_load_n(s->engine.flag, __ATOMIC_ACQUIRE);
    return (int32_t)(done - (uint32_t)seq) >= 0;
}

/* AUTO: has a flag marker at or after seq completed? */
static bool flag_covers(const weft__stream *s, uint64_t seq)
{
    return seq <= atomic_load_explicit(&s->engine.flag_marked, memory_order_acquire) &&
           flag_reached(s, seq);
}

bool weft__cuda_reached(weft__stream *s, uint64_t seq)
{
    switch (s->dev->engine.completion) {
    case WEFT__CUDA_FLAG:
        return flag_reached(s, seq);
    case WEFT__CUDA_AUTO:
        if (flag_covers(s, seq))
            return true;
        break;
    case WEFT__CUDA_EVENT:
    case WEFT__CUDA_CALLBACK:
        break;
    }
    return atomic_load_explicit(&s->engine.done, memory_order_acquire) >= seq;
}

/* EVENT, AUTO: query the oldest recorded markers and move "done" past those
 * that completed (in AUTO, a later flag may already say so). A query is a
 * driver call of microseconds, more while threads launch, so the lock is
 * let go around it: the stream's own task would spin on it to mark or
 * await meanwhile. Only the poller retires events, holding active_lock,
 * so the oldest one stays recorded while unlocked (marks append behind
 * it). Call with s->lock held; false when it could not be taken back. */
static bool query_events(weft__stream *s)
{
    bool flags = s->dev->engine.completion == WEFT__CUDA_AUTO;
    while (s->engine.ev_count > 0) {
        weft__cuda_mark_event m = s->engine.events[s->engine.ev_head];
        if (!(flags && flag_covers(s, m.seq))) {
            weft__lock_release(&s->lock);
            cudaError_t e = cudaEventQuery(m.event);
            if (e != cudaSuccess)
                cudaGetLastError(); /* not ready, or a fault: the backstop reports it */
            if (!weft__lock_try(&s->lock))
                return false; /* a waiter is linking in: next round */
            if (e != cudaSuccess)
                break;
        }
        atomic_store_explicit(&s->engine.done, m.seq, memory_order_release);
        s->engine.spare[s->engine.nspare++] = m.event; /* room: spare_cap >= ev_cap */
        s->engine.ev_head = (s->engine.ev_head + 1) % s->engine.ev_cap;
        s->engine.ev_count--;
    }
    return true;
}

/* The stream is idle once its last marker is done and nothing was enqueued
 * after it; on a failed device, nothing more will run. Call with s->lock
 * held. */
static void idle_if_done(weft__stream *s, int status)
{
    if (s->busy && !atomic_load_explicit(&s->unmarked, memory_order_relaxed) &&
        (status != WEFT_OK || weft__cuda_reached(s, s->marked))) {
        s->busy = false;
        weft__busy_end(&s->dev->base.busy);
    }
}

/* Fire the waiters s has reached (all of them, with status, if status is a
 * failure). Call with s->lock held. */
static unsigned fire_reached(weft__stream *s, int status)
{
    idle_if_done(s, status); /* before anyone woken below can look */
    unsigned fired = 0;
    weft__waiter *w;
    while ((w = s->engine.pending.head) != NULL) {
        marker *m = (marker *)((char *)w - offsetof(marker, w));
        if (status == WEFT_OK && !weft__cuda_reached(s, m->seq))
            break;
        weft__waitq_pop(&s->engine.pending);
        weft__waiter_fire(w, status); /* refused only by a timed-out wait, leaving */
        fired++;
    }
    atomic_fetch_sub(&s->dev->engine.npending, fired);
    return fired;
}

/* ---- markers ----------------------------------------------------------- */

/* EVENT, AUTO: make room for one more recorded marker. Call with s->lock held. */
static int reserve_event(weft__stream *s, cudaEvent_t *ev)
{
    if (s->engine.ev_count == s->engine.ev_cap) {
        unsigned cap = s->engine.ev_cap ? 2 * s->engine.ev_cap : 16;
        weft__cuda_mark_event *ring = malloc(cap * sizeof *ring);
        cudaEvent_t *spare = realloc(s->engine.spare, cap * sizeof *spare);
        if (!ring || !spare) {
            free(ring);
            if (spare)
                s->engine.spare = spare;
            return weft__fail(WEFT_ENOMEM, "weft_await: out of memory for events");
        }
        for (unsigned i = 0; i < s->engine.ev_count; i++)
            ring[i] = s->engine.events[(s->engine.ev_head + i) % s->engine.ev_cap];
        free(s->engine.events);
        s->engine.events = ring;
        s->engine.ev_head = 0;
        s->engine.ev_cap = s->engine.spare_cap = cap;
        s->engine.spare = spare;
    }
    if (s->engine.nspare > 0) {
        *ev = s->engine.spare[--s->engine.nspare];
        return WEFT_OK;
    }
    cudaError_t e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
    return e == cudaSuccess ? WEFT_OK : weft__cuda_fail(s->dev, "cudaEventCreateWithFlags", e);
}

typedef struct callback_mark {
    weft__stream *stream;
    uint64_t seq;
} callback_mark;

/* CALLBACK: runs on CUDA's thread once the work before the marker is done. */
static void CUDART_CB marker_reached(void *arg)
{
    callback_mark *cm = arg;
    weft__stream *s = cm->stream;
    weft__lock_acquire(&s->lock);
    atomic_store_explicit(&s->engine.done, cm->seq, memory_order_release);
    fire_reached(s, WEFT_OK);
    weft__lock_release(&s->lock);
    free(cm);
}

static int mark_flag(weft__stream *s, uint64_t seq)
{
    CUresult r = write_value((CUstream)s->handle, s->engine.flag_device, (cuuint32_t)seq, 0);
    if (r != CUDA_SUCCESS)
        return weft__fail(WEFT_EDEVICE, "cuStreamWriteValue32: driver error %d on GPU %d", (int)r,
                          s->dev->ordinal);
    atomic_store_explicit(&s->engine.flag_marked, seq, memory_order_release);
    return WEFT_OK;
}

static int mark_event(weft__stream *s, uint64_t seq)
{
    cudaEvent_t ev;
    int rc = reserve_event(s, &ev);
    if (rc)
        return rc;
    cudaError_t e = cudaEventRecord(ev, s->handle);
    if (e != cudaSuccess) {
        s->engine.spare[s->engine.nspare++] = ev;
        return weft__cuda_fail(s->dev, "cudaEventRecord", e);
    }
    s->engine.events[(s->engine.ev_head + s->engine.ev_count++) % s->engine.ev_cap] =
        (weft__cuda_mark_event){seq, ev};
    return WEFT_OK;
}

static int mark_callback(weft__stream *s, uint64_t seq)
{
    callback_mark *cm = malloc(sizeof *cm);
    if (!cm)
        return weft__fail(WEFT_ENOMEM, "weft_await: out of memory");
    *cm = (callback_mark){s, seq};
    cudaError_t e = cudaLaunchHostFunc(s->handle, marker_reached, cm);
    if (e != cudaSuccess) {
        free(cm);
        return weft__cuda_fail(s->dev, "cudaLaunchHostFunc", e);
    }
    return WEFT_OK;
}

/* AUTO: are markers to be events? The pollers' verdict on the last full
 * window, if that window is recent: with nothing pending nobody polls, and a
 * verdict from a crowded past would make the next burst events. */
static bool crowded(weft__cuda_device *dev)
{
    return atomic_load_explicit(&dev->engine.crowded, memory_order_relaxed) &&
           weft__now_ns() - atomic_load_explicit(&dev->engine.rate_start, memory_order_relaxed) <
               2 * RATE_WINDOW_NS;
}

/* Enqueue marker seq on s. Call with s->lock held. */
static int enqueue_marker(weft__stream *s, uint64_t seq)
{
    switch (s->dev->engine.completion) {
    case WEFT__CUDA_FLAG:
        return mark_flag(s, seq);
    case WEFT__CUDA_EVENT:
        return mark_event(s, seq);
    case WEFT__CUDA_CALLBACK:
        return mark_callback(s, seq);
    case WEFT__CUDA_AUTO:
        return crowded(s->dev) ? mark_event(s, seq) : mark_flag(s, seq);
    }
    return WEFT_EINVAL;
}

int weft__cuda_mark(weft__stream *s, uint64_t *seq)
{
    int rc = weft__cuda_enter(s, "weft_await");
    if (rc)
        return rc;
    weft__lock_acquire(&s->lock);
    uint64_t next = s->marked + 1;
    if ((rc = enqueue_marker(s, next)) == WEFT_OK) {
        s->marked = next;
        atomic_store_explicit(&s->unmarked, false, memory_order_relaxed);
    }
    weft__lock_release(&s->lock);
    if (rc == WEFT_OK)
        *seq = next;
    return rc;
}

/* ---- waiting ----------------------------------------------------------- */

/* Put s on the engine's list. Call with s->lock held: the lock order is
 * stream, then active_lock (the engine only try-locks streams). */
static void activate(weft__cuda_device *dev, weft__stream *s)
{
    if (s->engine.active)
        return;
    weft__lock_acquire(&dev->engine.active_lock);
    s->engine.active = true;
    dev->engine.active[dev->engine.nactive++] = s;
    weft__lock_release(&dev->engine.active_lock);
}

int weft__cuda_wait(weft__stream *s, uint64_t seq, uint64_t deadline)
{
    weft__cuda_device *dev = s->dev;
    int rc = weft__cuda_check_failed(dev, "weft_await");
    if (rc)
        return rc;

    marker m = {.seq = seq};
    weft__waiter_init(&m.w, WEFT__WAITS_GPU);
    weft__lock_acquire(&s->lock);
    if (weft__cuda_reached(s, seq)) { /* done already: no waiter fires for it */
        idle_if_done(s, WEFT_OK);
        weft__lock_release(&s->lock);
        return WEFT_OK;
    }
    weft__waitq_push(&s->engine.pending, &m.w); /* markers complete in order: FIFO */
    bool first = atomic_fetch_add(&dev->engine.npending, 1) == 0;
    activate(dev, s);
    if (first && dev->base.kick) /* nobody may be polling */
        dev->base.kick(dev->base.kick_ctx);
    rc = weft__waiter_wait_until(&m.w, &s->lock, false, deadline);
    if (weft__wait_withdrawn(rc)) { /* timed out: leave, as the poller would have popped it */
        weft__lock_acquire(&s->lock);
        if (m.w.linked) {
            weft__waitq_remove(&s->engine.pending, &m.w);
            atomic_fetch_sub(&dev->engine.npending, 1);
        }
        weft__lock_release(&s->lock);
    }
    if (rc == WEFT_EDEVICE)
        return weft__cuda_check_failed(dev, "weft_await");
    return rc;
}

/* EVENT, AUTO: the event recorded as s's marker seq, if it is still
 * waiting. Call with s->lock held. */
static cudaEvent_t marker_event(const weft__stream *s, uint64_t seq)
{
    for (unsigned i = 0; i < s->engine.ev_count; i++) {
        const weft__cuda_mark_event *m =
            &s->engine.events[(s->engine.ev_head + i) % s->engine.ev_cap];
        if (m->seq == seq)
            return m->event;
    }
    return NULL;
}

/* s waits on the GPU for other's marker seq, and for nothing after it:
 * for other's word when seq is a flag (FLAG; AUTO, when seq has no event),
 * for seq's event (EVENT, AUTO), for nothing once other has reached seq.
 * Waiting for a later marker could wait for work that itself waits for s.
 * A stream capturing a graph region cannot wait for an event from outside
 * it, and CALLBACK has neither: there the task waits itself, so that its
 * later work still starts after. */
int weft__cuda_stream_wait(weft__stream *s, weft__stream *other, uint64_t seq)
{
    int rc = weft__cuda_enter(s, "weft_stream_wait");
    if (rc || (s->graph.recording && (rc = weft__cuda_region_capture(s))))
        return rc;
    weft__cuda_completion mode = s->dev->engine.completion;
    enum { BY_WORD, BY_EVENT, REACHED, BY_TASK } how = mode == WEFT__CUDA_FLAG ? BY_WORD : BY_TASK;
    cudaError_t e = cudaSuccess;
    if (mode == WEFT__CUDA_EVENT || mode == WEFT__CUDA_AUTO) {
        weft__lock_acquire(&other->lock); /* seq's event is not recorded again meanwhile */
        cudaEvent_t ev = marker_event(other, seq);
        if (weft__cuda_reached(other, seq))
            how = REACHED;
        else if (ev && !s->graph.capture) {
            e = cudaStreamWaitEvent(s->handle, ev, 0);
            how = BY_EVENT;
        } else if (!ev && mode == WEFT__CUDA_AUTO)
            how = BY_WORD;
        weft__lock_release(&other->lock);
    }
    switch (how) {
    case BY_WORD: {
        CUresult r = wait_value((CUstream)s->handle, other->engine.flag_device, (cuuint32_t)seq,
                                CU_STREAM_WAIT_VALUE_GEQ);
        if (r != CUDA_SUCCESS)
            return weft__fail(WEFT_EDEVICE, "cuStreamWaitValue32: driver error %d on GPU %d",
                              (int)r, s->dev->ordinal);
        return WEFT_OK;
    }
    case BY_EVENT:
        return e == cudaSuccess ? WEFT_OK : weft__cuda_fail(s->dev, "cudaStreamWaitEvent", e);
    case REACHED:
        return WEFT_OK;
    case BY_TASK:
        break;
    }
    return (rc = weft__task_may_suspend("weft_stream_wait"))
               ? rc
               : weft__cuda_wait(other, seq, WEFT_FOREVER);
}

/* ---- polling ----------------------------------------------------------- */

/* Query the next few active streams for a sticky error. Call with
 * active_lock held. */
static void backstop(weft__cuda_device *dev)
{
    unsigned n = dev->engine.nactive < BACKSTOP_QUERIES ? dev->engine.nactive : BACKSTOP_QUERIES;
    for (unsigned i = 0; i < n && !atomic_load(&dev->failed); i++) {
        weft__stream *s = dev->engine.active[dev->engine.next_query++ % dev->engine.nactive];
        cudaError_t e = cudaStreamQuery(s->handle);
        if (e != cudaSuccess && e != cudaErrorNotReady)
            weft__cuda_fail(dev, "cudaStreamQuery", e);
    }
}

/* AUTO: count what the pollers fired; at the end of each window, decide
 * whether the next markers are events. Call with active_lock held. */
static void count_completions(weft__cuda_device *dev, unsigned fired, uint64_t now)
{
    uint64_t start = atomic_load_explicit(&dev->engine.rate_start, memory_order_relaxed);
    dev->engine.rate_fired += fired;
    if (now - start < RATE_WINDOW_NS)
        return;
    bool many =
        dev->engine.nactive >= CROWD_STREAMS &&
        (uint64_t)dev->engine.rate_fired * 1000000000u >= (uint64_t)CROWD_RATE * (now - start);
    atomic_store_explicit(&dev->engine.crowded, many, memory_order_relaxed);
    atomic_store_explicit(&dev->engine.rate_start, now, memory_order_relaxed);
    dev->engine.rate_fired = 0;
}

unsigned weft__cuda_poll(weft__device *d)
{
    weft__cuda_device *dev = (weft__cuda_device *)d;
    if (atomic_load_explicit(&dev->engine.npending, memory_order_relaxed) == 0 ||
        !weft__lock_try(&dev->engine.active_lock)) /* someone else is polling */
        return 0;
    uint64_t now = weft__now_ns();
    if (now - dev->engine.last_backstop >= BACKSTOP_NS) {
        dev->engine.last_backstop = now;
        if (weft__cuda_use_device(dev) == WEFT_OK)
            backstop(dev);
    }
    int status = atomic_load(&dev->failed) ? WEFT_EDEVICE : WEFT_OK;
    bool events =
        dev->engine.completion == WEFT__CUDA_EVENT || dev->engine.completion == WEFT__CUDA_AUTO;
    unsigned misses = UINT_MAX, n = dev->engine.nactive, start = 0;
    if (events && status == WEFT_OK && n > 0) {
        start = dev->engine.next_poll % n;
        if (now - dev->engine.last_sweep < SWEEP_NS)
            misses = EVENT_MISSES;
        else
            dev->engine.last_sweep = now;
    }
    unsigned fired = 0, k = 0;
    for (; k < n && misses > 0; k++) {
        weft__stream *s = dev->engine.active[(start + k) % n];
        if (!weft__lock_try(&s->lock)) /* a waiter is linking in: next round */
            continue;
        if (status == WEFT_OK && s->engine.ev_count > 0 && !query_events(s)) {
            misses--; /* its query spent, the lock lost to a waiter */
            continue;
        }
        if (dev->engine.completion != WEFT__CUDA_CALLBACK || status != WEFT_OK)
            fired += fire_reached(s, status);
        if (s->engine.pending.head == NULL)
            s->engine.active = false;    /* dropped from the list below */
        else if (s->engine.ev_count > 0) /* it took a query that said "not yet" */
            misses--;
        weft__lock_release(&s->lock);
    }
    dev->engine.next_poll = start + k;
    if (dev->engine.completion == WEFT__CUDA_AUTO)
        count_completions(dev, fired, now);
    for (unsigned i = 0; i < dev->engine.nactive;) {
        if (dev->engine.active[i]->engine.active)
            i++;
        else
            dev->engine.active[i] = dev->engine.active[--dev->engine.nactive];
    }
    weft__lock_release(&dev->engine.active_lock);
    return fired;
}

bool weft__cuda_pending(weft__device *d)
{
    return atomic_load_explicit(&((weft__cuda_device *)d)->engine.npending, memory_order_relaxed) >
           0;
}

/*
 * host.c - the host device backend: streams executed by host threads.
 *
 * Same stream semantics as a GPU, so a weft program runs (and is tested) on
 * a machine without one. A stream is an in-order FIFO of operations (copy =
 * memmove, fill = memset, host_fn = a call). Enqueueing a first operation on
 * an idle stream puts the stream on the device's ready list; `threads`
 * executor threads take ready streams and run their operations in order.
 *
 * Completion: every stream counts operations enqueued and completed. A sync
 * links a marker (a waiter plus the count it waits for) into the stream's
 * pending FIFO and suspends. Markers are linked in enqueue order, so their
 * targets never decrease: the executor checks only the head.
 *
 * Invariants:
 *  - A stream is `scheduled` from the moment it has work until an executor
 *    finds it empty; while scheduled it is on the ready list (or about to be
 *    put there by the enqueuer that set the flag) or held by exactly one
 *    executor. Hence one executor at a time per stream (order holds), and
 *    different streams run in parallel.
 *  - completed <= enqueued; every pending marker has completed < target <=
 *    enqueued, so a pending marker implies a scheduled stream.
 *  - The stream lock guards the queue, counters, markers and op cache; it is
 *    never held while an operation runs. The ready list and executor sleep
 *    are guarded by ready_mu (executors are plain threads and sleep on a
 *    condition variable, so an idle device uses no CPU). The pool lock
 *    guards lease counts and the lease heap.
 *  - No path holds two of these locks at once. A stream lock is held while
 *    firing a marker's waiter, so the task layer's locks nest inside it.
 *  - The device is busy (device.h) while any stream is scheduled: queued
 *    or running work counts, from the enqueue that schedules the stream to
 *    the batch that leaves it empty.
 *  - Operation records come from a per-stream cache: no malloc per operation
 *    once warm, and no cross-stream contention on a shared freelist.
 *  - Memory is freed only if this backend handed it out and has not taken
 *    it back: host blocks are in their device's set, weft_malloc_async's in
 *    one set for the process (a task of any runtime may free them, as with
 *    CUDA), from allocation to the free call (core/addrset.h).
 */
#include <assert.h>
#include <pthread.h>
#include <signal.h>
#include <stdalign.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/addrset.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/lock.h"
#include "device/device.h"
#include "task/task.h"
#include "task/wait.h"

enum {
    DEFAULT_THREADS = 2,
    OP_CACHE_MAX = 128, /* free op records kept per stream */
    IDLE_SPINS = 512,   /* polls of the ready list before an executor sleeps */
};

typedef enum op_kind { OP_COPY, OP_FILL, OP_CALL } op_kind;

typedef struct op {
    struct op *next;
    op_kind kind;
    union {
        struct {
            void *dst;
            const void *src;
            size_t n;
        } copy;
        struct {
            void *dst;
            int value;
            size_t n;
        } fill;
        struct {
            void (*fn)(void *arg);
            void *arg;
        } call;
    } u;
    uint64_t task; /* the enqueuing task's trace id; 0 unless recording */
} op;

/* A sync's completion marker; lives on the syncing task's stack. */
typedef struct marker {
    weft__waiter w;
    uint64_t target; /* fire once completed reaches this */
} marker;

typedef struct host_device host_device;

struct weft__stream {
    alignas(64) weft__lock lock; /* streams never share a cache line */
    op *head, *tail;             /* queued, not yet taken by an executor */
    uint64_t enqueued;
    uint64_t completed;
    weft__waitq pending; /* markers, targets non-decreasing */
    bool scheduled;      /* has work: on the ready list or being run */
    op *cache;           /* free op records */
    unsigned cache_len;

    weft__stream *ready_next; /* guarded by dev->ready_mu */
    unsigned leases;          /* guarded by dev->pool_lock */
    unsigned heap_pos;        /* guarded by dev->pool_lock */
    unsigned id;              /* its place in the pool: the timeline's track */
    host_device *dev;
    weft__stream_counts counts; /* for the run's diagnosis (device.h) */
};

struct host_device {
    weft__device base; /* first: the core sees only this */

    pthread_mutex_t ready_mu;
    pthread_cond_t ready_cv;
    weft__stream *ready_head, *ready_tail;
    atomic_uint nready; /* ready list length; read without ready_mu as a hint */
    unsigned sleepers;  /* executors waiting on ready_cv */
    bool stopping;
    pthread_t *threads;
    unsigned nthreads;

    /* Every stream, in a min-heap on lease count: the root is a free stream
     * if there is one, else the least shared. */
    weft__lock pool_lock;
    weft__stream **heap;
    unsigned nstreams;
    atomic_uint leased; /* leases held now */
    atomic_uint leased_max;

    weft__addrset host_blocks; /* weft_host_alloc's and weft_mapped_alloc's */
};

/* weft_malloc_async's blocks not yet given to weft_free_async. */
static weft__addrset device_blocks = WEFT__ADDRSET_INIT;

static host_device *host_of(weft__device *dev)
{
    return (host_device *)dev;
}

static marker *marker_of(weft__waiter *w)
{
    return (marker *)((char *)w - offsetof(marker, w));
}

/* ---- the ready list --------------------------------------------------- */

static void ready_push(host_device *dev, weft__stream *s)
{
    bool wake;

    pthread_mutex_lock(&dev->ready_mu);
    s->ready_next = NULL;
    if (dev->ready_tail)
        dev->ready_tail->ready_next = s;
    else
        dev->ready_head = s;
    dev->ready_tail = s;
    atomic_fetch_add_explicit(&dev->nready, 1, memory_order_relaxed);
    wake = dev->sleepers > 0;
    pthread_mutex_unlock(&dev->ready_mu);
    if (wake)
        pthread_cond_signal(&dev->ready_cv);
}

/* Call with ready_mu held. */
static weft__stream *ready_pop(host_device *dev)
{
    weft__stream *s = dev->ready_head;

    if (!s)
        return NULL;
    dev->ready_head = s->ready_next;
    if (!dev->ready_head)
        dev->ready_tail = NULL;
    atomic_fetch_sub_explicit(&dev->nready, 1, memory_order_relaxed);
    return s;
}

/* The next stream to run, or NULL once the device stops and nothing is left.
 * Polls briefly first: work often arrives right after the last batch. */
static weft__stream *ready_take(host_device *dev)
{
    weft__stream *s;

    for (unsigned i = 0; i < IDLE_SPINS; i++) {
        if (atomic_load_explicit(&dev->nready, memory_order_relaxed) != 0)
            break;
        weft__cpu_relax();
    }
    pthread_mutex_lock(&dev->ready_mu);
    while (!dev->ready_head && !dev->stopping) {
        dev->sleepers++;
        pthread_cond_wait(&dev->ready_cv, &dev->ready_mu);
        dev->sleepers--;
    }
    s = ready_pop(dev);
    pthread_mutex_unlock(&dev->ready_mu);
    return s;
}

/* ---- running a stream ------------------------------------------------- */

/* What an executor took from a stream in one go. */
typedef struct batch {
    op *ops;
    uint64_t done;    /* completed count, advanced as ops run */
    uint64_t end;     /* completed count once the batch has run */
    uint64_t fire_at; /* target of the head marker, UINT64_MAX if none */
    unsigned room;    /* op records the stream's cache can take back */
    op *keep, *keep_tail;
    unsigned kept;
} batch;

static uint64_t head_target(const weft__stream *s)
{
    return s->pending.head ? marker_of(s->pending.head)->target : UINT64_MAX;
}

/* Fire the markers that completed has reached. Call with s->lock held. */
static void fire_reached(weft__stream *s)
{
    weft__waiter *w;

    while ((w = s->pending.head) != NULL && marker_of(w)->target <= s->completed) {
        weft__waitq_pop(&s->pending);
        weft__waiter_fire(w, WEFT_OK); /* refused only by a timed-out wait, leaving */
    }
}

static void batch_take(weft__stream *s, batch *b)
{
    weft__lock_acquire(&s->lock);
    b->ops = s->head;
    s->head = s->tail = NULL;
    b->done = s->completed;
    b->end = s->enqueued;
    b->fire_at = head_target(s);
    b->room = OP_CACHE_MAX - s->cache_len;
    weft__lock_release(&s->lock);
    b->keep = b->keep_tail = NULL;
    b->kept = 0;
}

static void op_run(weft__stream *s, const op *o)
{
    uint64_t start;
    switch (o->kind) {
    case OP_COPY:
        /* memmove: overlapping ranges get a defined result at no real cost.
         * Timed for the diagnosis of copies that dominate: two clock reads
         * on the executor, beside a copy of some size. */
        start = weft__now_ns();
        memmove(o->u.copy.dst, o->u.copy.src, o->u.copy.n);
        weft__tally(&s->counts.copy_ns, weft__now_ns() - start);
        break;
    case OP_FILL:
        memset(o->u.fill.dst, o->u.fill.value, o->u.fill.n);
        break;
    case OP_CALL:
        o->u.call.fn(o->u.call.arg);
        break;
    }
}

/* op_run, reported to the timeline from the executor that runs it. */
__attribute__((noinline)) static void op_run_traced(weft__stream *s, const op *o)
{
    static const weft__op_kind kinds[] = {
        [OP_COPY] = WEFT__OP_COPY, [OP_FILL] = WEFT__OP_FILL, [OP_CALL] = WEFT__OP_HOST_FN};
    weft__trace *tr = s->dev->base.trace;
    uint64_t start = weft__now_ns();
    op_run(s, o);
    if (tr && weft__trace_recording(tr))
        weft__trace_op(tr, s->dev->base.index, s->id, kinds[o->kind], NULL,
                       o->kind == OP_COPY ? o->u.copy.n : o->kind == OP_FILL ? o->u.fill.n : 0,
                       o->task, start, weft__now_ns());
}

/* Keep o for the stream's cache, or free it if the cache is full. The cache
 * only shrinks while the batch runs, so `room` taken at batch_take holds. */
static void batch_recycle(batch *b, op *o)
{
    if (b->kept == b->room) {
        free(o);
        return;
    }
    o->next = b->keep;
    if (!b->keep)
        b->keep_tail = o;
    b->keep = o;
    b->kept++;
}

/* Run the batch's operations in order. A marker fires as soon as the
 * operations before it are done, not at the end of the batch: only markers
 * linked before batch_take can fall inside it (later ones wait for at least
 * b->end), so the head target snapshot stays valid between checks (a marker
 * that timed out and left only makes it early; fire_reached checks). */
static void batch_run(weft__stream *s, batch *b)
{
    op *o = b->ops, *next;

    for (; o; o = next) {
        next = o->next;
        if (weft__trace_on())
            op_run_traced(s, o);
        else
            op_run(s, o);
        b->done++;
        batch_recycle(b, o);
        if (b->done >= b->fire_at && b->done < b->end) {
            weft__lock_acquire(&s->lock);
            s->completed = b->done;
            fire_reached(s);
            b->fire_at = head_target(s);
            weft__lock_release(&s->lock);
        }
    }
}

/* Account for the batch. Returns true if more work arrived meanwhile (the
 * stream stays scheduled), false once the stream is idle. */
static bool batch_finish(weft__stream *s, batch *b)
{
    bool more;

    weft__lock_acquire(&s->lock);
    s->completed = b->end;
    more = s->head != NULL;
    if (!more) { /* idle before anyone woken below can look */
        s->scheduled = false;
        weft__busy_end(&s->dev->base.busy);
    }
    fire_reached(s);
    if (b->keep) {
        b->keep_tail->next = s->cache;
        s->cache = b->keep;
        s->cache_len += b->kept;
    }
    weft__lock_release(&s->lock);
    return more;
}

/* Run s until it is idle, or hand it back to the ready list after a batch
 * when other streams are waiting, so a busy stream cannot starve them. */
static void stream_run(host_device *dev, weft__stream *s)
{
    batch b;

    for (;;) {
        batch_take(s, &b);
        batch_run(s, &b);
        if (!batch_finish(s, &b))
            return;
        if (atomic_load_explicit(&dev->nready, memory_order_relaxed) != 0) {
            ready_push(dev, s);
            return;
        }
    }
}

static void *executor_main(void *arg)
{
    host_device *dev = arg;
    weft__stream *s;

    while ((s = ready_take(dev)) != NULL)
        stream_run(dev, s);
    return NULL;
}

/* ---- enqueue and sync ------------------------------------------------- */

/* The trace id of the task enqueueing on s, for the timeline to tie the
 * operation to it as the CUDA backend does; 0 while s's runtime does not
 * record (no id is handed out then). */
static uint64_t enqueuer(const weft__stream *s)
{
    weft__trace *tr = s->dev->base.trace;
    weft__task *t;
    if (!weft__trace_on() || !tr || !weft__trace_recording(tr) || !(t = weft__task_self()))
        return 0;
    return weft__trace_task_id(tr, &t->trace.id);
}

/* Append a copy of *proto to s and make sure an executor will run it. */
static int stream_push(weft__stream *s, const op *proto, const char *what)
{
    op *o;
    bool wake;
    uint64_t task = enqueuer(s);

    weft__lock_acquire(&s->lock);
    o = s->cache;
    if (o) {
        s->cache = o->next;
        s->cache_len--;
    } else {
        weft__lock_release(&s->lock);
        o = malloc(sizeof *o);
        if (!o)
            return weft__fail(WEFT_ENOMEM, "%s: out of memory for an operation record", what);
        weft__lock_acquire(&s->lock);
    }
    *o = *proto;
    o->next = NULL;
    o->task = task;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    s->enqueued++;
    wake = !s->scheduled;
    s->scheduled = true;
    if (wake)
        weft__busy_begin(&s->dev->base.busy);
    weft__lock_release(&s->lock);
    if (wake)
        ready_push(s->dev, s);
    return WEFT_OK;
}

static int host_copy(weft__stream *s, void *dst, const void *src, size_t n)
{
    op o = {.kind = OP_COPY, .u.copy = {dst, src, n}};

    if (!s)
        return weft__fail(WEFT_EINVAL, "host copy: stream is NULL");
    if (n == 0)
        return WEFT_OK;
    if (!dst || !src)
        return weft__fail(WEFT_EINVAL, "host copy: %s is NULL (n = %zu)", dst ? "src" : "dst", n);
    int rc = stream_push(s, &o, "host copy");
    if (rc == WEFT_OK)
        weft__tally(&s->counts.copy_bytes[WEFT_COPY_HOST], n);
    return rc;
}

static int host_fill(weft__stream *s, void *dst, int value, size_t n)
{
    op o = {.kind = OP_FILL, .u.fill = {dst, value, n}};

    if (!s)
        return weft__fail(WEFT_EINVAL, "host fill: stream is NULL");
    if (n == 0)
        return WEFT_OK;
    if (!dst)
        return weft__fail(WEFT_EINVAL, "host fill: dst is NULL (n = %zu)", n);
    return stream_push(s, &o, "host fill");
}

static int host_host_fn(weft__stream *s, void (*fn)(void *arg), void *arg)
{
    op o = {.kind = OP_CALL, .u.call = {fn, arg}};

    if (!s)
        return weft__fail(WEFT_EINVAL, "host host_fn: stream is NULL");
    if (!fn)
        return weft__fail(WEFT_EINVAL, "host host_fn: fn is NULL");
    return stream_push(s, &o, "host host_fn");
}

static int host_launch(weft__stream *s, const void *kernel, weft_dim3 grid, weft_dim3 block,
                       size_t shared_bytes, void **args)
{
    (void)s, (void)kernel, (void)grid, (void)block, (void)shared_bytes, (void)args;
    return weft__fail(WEFT_EINVAL,
                      "weft_launch: the host backend has no kernels; run host code with "
                      "weft_host_async");
}

/* Host "device memory" is host memory: allocating needs no ordering, and a
 * free is queued behind the work that may still use the block. */
static int host_malloc_async(weft__stream *s, void **ptr, size_t n)
{
    void *p = malloc(n);

    (void)s;
    if (p && weft__addrset_add(&device_blocks, (uintptr_t)p, 0) == WEFT_OK) {
        *ptr = p;
        weft__tally(&s->counts.allocs, 1);
        return WEFT_OK;
    }
    free(p);
    return weft__fail(WEFT_ENOMEM, "weft_malloc_async: no memory for %zu bytes", n);
}

static int host_free_async(weft__stream *s, void *ptr)
{
    if (!weft__addrset_take(&device_blocks, (uintptr_t)ptr, NULL))
        return weft__fail(WEFT_EINVAL,
                          "weft_free_async: %p is not a block of weft_malloc_async, or was "
                          "freed already",
                          ptr);
    int rc = host_host_fn(s, free, ptr);
    if (rc != WEFT_OK) /* not queued: still the caller's (if listing fails, leaked) */
        weft__addrset_add(&device_blocks, (uintptr_t)ptr, 0);
    else
        weft__tally(&s->counts.frees, 1);
    return rc;
}

/* Every operation counts, so the point after the last one is its count. */
static int host_mark(weft__stream *s, uint64_t *seq)
{
    weft__lock_acquire(&s->lock);
    *seq = s->enqueued;
    weft__lock_release(&s->lock);
    return WEFT_OK;
}

/* Host operations cannot fail once enqueued, so a wait only ever waits
 * (or times out: then its marker leaves the queue, which stays in order). */
static int host_wait(weft__stream *s, uint64_t seq, uint64_t deadline)
{
    marker m;

    if (!s)
        return weft__fail(WEFT_EINVAL, "host wait: stream is NULL");
    weft__lock_acquire(&s->lock);
    if (s->completed >= seq) {
        weft__lock_release(&s->lock);
        return WEFT_OK;
    }
    weft__waiter_init(&m.w, WEFT__WAITS_HOST_DEVICE);
    m.target = seq;
    weft__waitq_push(&s->pending, &m.w);
    return weft__waitq_park_until(&s->pending, &m.w, &s->lock, false, deadline);
}

/* Executors take no dependencies between streams, so the enqueuing task
 * waits for the other stream itself: later work on s then starts after. */
static int host_stream_wait(weft__stream *s, weft__stream *other, uint64_t seq)
{
    (void)s;
    int rc = weft__task_may_suspend("weft_stream_wait");
    return rc ? rc : host_wait(other, seq, WEFT_FOREVER);
}

static void *host_native(weft__stream *s)
{
    (void)s;
    return NULL;
}

static int host_host_alloc(weft__device *d, void **ptr, size_t n, bool mapped, void **device_ptr)
{
    void *p = malloc(n);

    if (!p || weft__addrset_add(&host_of(d)->host_blocks, (uintptr_t)p, 0) != WEFT_OK) {
        free(p);
        return weft__fail(WEFT_ENOMEM, "host memory: no memory for %zu bytes", n);
    }
    *ptr = p;
    if (mapped)
        *device_ptr = p;
    return WEFT_OK;
}

static int host_host_free(weft__device *d, void *ptr, const char *call)
{
    if (!weft__addrset_take(&host_of(d)->host_blocks, (uintptr_t)ptr, NULL))
        return weft__fail(WEFT_EINVAL,
                          "%s: %p is not a block this runtime handed out, or was freed already",
                          call, ptr);
    free(ptr);
    return WEFT_OK;
}

/* ---- the stream pool -------------------------------------------------- */

static void heap_swap(weft__stream **heap, unsigned i, unsigned j)
{
    weft__stream *t = heap[i];

    heap[i] = heap[j];
    heap[j] = t;
    heap[i]->heap_pos = i;
    heap[j]->heap_pos = j;
}

static void heap_up(weft__stream **heap, unsigned i)
{
    while (i > 0 && heap[(i - 1) / 2]->leases > heap[i]->leases) {
        heap_swap(heap, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(weft__stream **heap, unsigned n, unsigned i)
{
    for (;;) {
        unsigned min = i, l = 2 * i + 1, r = l + 1;

        if (l < n && heap[l]->leases < heap[min]->leases)
            min = l;
        if (r < n && heap[r]->leases < heap[min]->leases)
            min = r;
        if (min == i)
            return;
        heap_swap(heap, i, min);
        i = min;
    }
}

static weft__stream *stream_new(host_device *dev)
{
    weft__stream *s = aligned_alloc(alignof(weft__stream), sizeof *s);

    if (!s)
        return NULL;
    memset(s, 0, sizeof *s);
    atomic_init(&s->lock.held, false);
    s->dev = dev;
    return s;
}

static void stream_free(weft__stream *s)
{
    op *o, *next;

    for (o = s->cache; o; o = next) {
        next = o->next;
        free(o);
    }
    free(s);
}

/* Lease the root (a free stream, else the least shared). Call with the pool
 * lock held. Returns NULL when the pool should grow instead. */
static weft__stream *pool_take(host_device *dev)
{
    weft__stream *s;

    if (dev->nstreams == 0 || (dev->heap[0]->leases > 0 && dev->nstreams < WEFT__HOST_STREAMS_MAX))
        return NULL;
    s = dev->heap[0];
    s->leases++;
    heap_down(dev->heap, dev->nstreams, 0);
    return s;
}

static int host_stream_lease(weft__device *d, int priority, weft__stream **out)
{
    host_device *dev = host_of(d);
    weft__stream *s, *fresh = NULL;

    for (;;) {
        weft__lock_acquire(&dev->pool_lock);
        s = pool_take(dev);
        if (!s && fresh) {
            s = fresh;
            fresh = NULL;
            s->leases = 1;
            s->id = dev->nstreams;
            s->heap_pos = dev->nstreams;
            dev->heap[dev->nstreams++] = s;
            heap_up(dev->heap, s->heap_pos);
        }
        weft__lock_release(&dev->pool_lock);
        if (s)
            break;
        /* Allocate outside the lock; another lease may grow the pool first,
         * in which case we look again and drop ours if it is not needed. */
        fresh = stream_new(dev);
        if (!fresh)
            return weft__fail(WEFT_ENOMEM, "host stream lease: out of memory for a stream");
    }
    if (fresh)
        stream_free(fresh);
    (void)priority; /* executors serve streams in turn */
    unsigned now = atomic_fetch_add_explicit(&dev->leased, 1, memory_order_relaxed) + 1;
    weft__leases_note(&dev->leased_max, now);
    *out = s;
    return WEFT_OK;
}

static void host_stream_return(weft__device *d, weft__stream *s)
{
    host_device *dev = host_of(d);

    weft__lock_acquire(&dev->pool_lock);
    assert(s->leases > 0);
    s->leases--;
    heap_up(dev->heap, s->heap_pos);
    weft__lock_release(&dev->pool_lock);
    atomic_fetch_sub_explicit(&dev->leased, 1, memory_order_relaxed);
}

static unsigned host_load(weft__device *d)
{
    return atomic_load_explicit(&host_of(d)->leased, memory_order_relaxed);
}

static void host_stats(weft__device *d, weft__device_stats *sum)
{
    host_device *dev = host_of(d);

    weft__lock_acquire(&dev->pool_lock);
    for (unsigned i = 0; i < dev->nstreams; i++)
        weft__stream_counts_add(&dev->heap[i]->counts, sum);
    weft__lock_release(&dev->pool_lock);
    unsigned max = atomic_load_explicit(&dev->leased_max, memory_order_relaxed);
    if (max > sum->leases_max)
        sum->leases_max = max;
    weft__lock_acquire(&dev->host_blocks.lock);
    sum->host_blocks += dev->host_blocks.count;
    weft__lock_release(&dev->host_blocks.lock);
}

/* ---- creating and destroying the device ------------------------------- */

static void executors_stop(host_device *dev)
{
    pthread_mutex_lock(&dev->ready_mu);
    dev->stopping = true;
    pthread_mutex_unlock(&dev->ready_mu);
    pthread_cond_broadcast(&dev->ready_cv);
    for (unsigned i = 0; i < dev->nthreads; i++)
        pthread_join(dev->threads[i], NULL);
    dev->nthreads = 0;
}

/* Executors run with every signal blocked, so that process-directed signals
 * go to the application's threads, never into a host function. */
static int executors_start(host_device *dev, unsigned n)
{
    sigset_t all, old;
    char name[16];
    int rc = 0;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (unsigned i = 0; i < n; i++) {
        rc = pthread_create(&dev->threads[i], NULL, executor_main, dev);
        if (rc != 0)
            break;
        snprintf(name, sizeof name, "weft-host/%u", i % 10000u);
        pthread_setname_np(dev->threads[i], name);
        dev->nthreads++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        executors_stop(dev);
        return weft__fail(WEFT_ESYS, "host device: cannot start executor thread: %s", strerror(rc));
    }
    return WEFT_OK;
}

static void host_free(host_device *dev)
{
    for (unsigned i = 0; i < dev->nstreams; i++)
        stream_free(dev->heap[i]);
    free(dev->heap);
    free(dev->threads);
    weft__addrset_fini(&dev->host_blocks);
    pthread_cond_destroy(&dev->ready_cv);
    pthread_mutex_destroy(&dev->ready_mu);
    free(dev);
}

/* Executors leave only when the ready list is empty; a stream still running
 * is requeued or finished by its executor first, so this drains all work. */
static void host_destroy(weft__device *d)
{
    host_device *dev = host_of(d);

    executors_stop(dev);
    for (unsigned i = 0; i < dev->nstreams; i++)
        assert(!dev->heap[i]->scheduled && !dev->heap[i]->pending.head);
    host_free(dev);
}

static const weft__device_ops host_ops = {
    .name = "host",
    .destroy = host_destroy,
    .stream_lease = host_stream_lease,
    .stream_return = host_stream_return,
    .load = host_load,
    .copy = host_copy,
    .fill = host_fill,
    .host_fn = host_host_fn,
    .launch = host_launch,
    .malloc_async = host_malloc_async,
    .free_async = host_free_async,
    .mark = host_mark,
    .wait = host_wait,
    .stream_wait = host_stream_wait,
    .native = host_native,
    .host_alloc = host_host_alloc,
    .host_free = host_host_free,
    .stats = host_stats,
};

int weft__host_device_create(weft__device **out, unsigned threads)
{
    host_device *dev;
    int rc;

    if (!out)
        return weft__fail(WEFT_EINVAL, "host device: out is NULL");
    if (threads == 0)
        threads = DEFAULT_THREADS;
    dev = calloc(1, sizeof *dev);
    if (!dev)
        return weft__fail(WEFT_ENOMEM, "host device: out of memory");
    dev->base.ops = &host_ops;
    atomic_init(&dev->pool_lock.held, false);
    pthread_mutex_init(&dev->ready_mu, NULL);
    pthread_cond_init(&dev->ready_cv, NULL);
    dev->threads = calloc(threads, sizeof *dev->threads);
    dev->heap = calloc(WEFT__HOST_STREAMS_MAX, sizeof *dev->heap);
    if (!dev->threads || !dev->heap) {
        rc = weft__fail(WEFT_ENOMEM, "host device: out of memory");
        goto fail;
    }
    rc = executors_start(dev, threads);
    if (rc != WEFT_OK)
        goto fail;
    *out = &dev->base;
    return WEFT_OK;

fail:
    host_free(dev);
    return rc;
}

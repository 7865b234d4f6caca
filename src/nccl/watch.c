/*
 * watch.c - the watcher of libweft_nccl's collectives (comm.h says what it
 * does, and why: a dead peer must fail the tasks that await its
 * collectives, not hang them).
 *
 * The watcher follows the completion engine's pattern: it tests what is in
 * flight (each operation's event), backs off while nothing changes (0.1 to
 * 2 ms between passes) and parks when nothing is in flight. A pass also
 * asks each busy communicator for its asynchronous error and compares its
 * oldest operation's age with its timeout.
 *
 * Invariants:
 *  - One lock (w.lock) guards the operations in flight, the watcher's
 *    fields of every communicator and the decision to abort one: a
 *    communicator's `aborted` is set under it, and ncclCommGetAsyncError is
 *    called only under it, on a communicator not aborted, so no poll reads
 *    one NCCL has freed. ncclCommAbort itself runs outside the lock (it may
 *    take long), its operations' verdicts given first; `aborting` keeps
 *    the communicator's memory alive until it returns.
 *  - An operation is held by the list and by its task's await check;
 *    whichever lets go last frees it and keeps its event for the next
 *    operation on its GPU (while the watcher runs). An operation off the
 *    list no longer refers to its communicator, which may then go.
 *  - A communicator being destroyed (`closing`) is no longer polled or
 *    aborted here: its finalize polls it and aborts it on an error.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "device/await_check.h"
#include "nccl/comm.h"

enum {
    NAP_MIN_NS = 100000,  /* the first nap while something is in flight */
    NAP_MAX_NS = 2000000, /* the nap grows to this while nothing ends */
    POOL_DEVICES = 64,    /* GPUs whose spare events are kept */
    POOL_EVENTS = 64,     /* spare events kept a GPU */
};

/* One operation (a collective, or a group's share on one communicator). */
typedef struct op {
    struct op *next, *prev;
    weft_nccl_comm *comm; /* while listed */
    int device;           /* its communicator's GPU */
    cudaEvent_t done;     /* recorded after it on its stream */
    const char *fn;       /* the call that enqueued it */
    uint64_t since;       /* when it was enqueued */
    int refs;             /* the list's and the task's */
    int code;             /* the verdict: WEFT_OK, or why its communicator went */
    char cause[200];
} op;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work;    /* the watcher parks on it */
    pthread_cond_t changed; /* an abort returned; the thread stopped */
    op *head;               /* in flight, newest first */
    unsigned comms;         /* communicators watched */
    unsigned pass;          /* the watcher's passes, to poll a communicator once a pass */
    bool running, stopping;
    pthread_t thread;
    struct {
        cudaEvent_t ev[POOL_EVENTS];
        unsigned n;
    } spare[POOL_DEVICES]; /* events of ended operations, by GPU */
} w = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .work = PTHREAD_COND_INITIALIZER,
    .changed = PTHREAD_COND_INITIALIZER,
};

/* ---- operations (the lock held) ------------------------------------------ */

static void op_free(op *o)
{
    if (w.running && o->device < POOL_DEVICES && w.spare[o->device].n < POOL_EVENTS)
        w.spare[o->device].ev[w.spare[o->device].n++] = o->done;
    else
        cudaEventDestroy(o->done);
    free(o);
}

static void op_put(op *o)
{
    if (--o->refs == 0)
        op_free(o);
}

/* o leaves the list with its verdict as it stands. */
static void retire(op *o)
{
    if (o->prev)
        o->prev->next = o->next;
    else
        w.head = o->next;
    if (o->next)
        o->next->prev = o->prev;
    o->comm = NULL;
    op_put(o);
}

/* Has o's work ended? A device error counts as ended: the task's await
 * reports that one itself. */
static bool ended(const op *o)
{
    cudaError_t e = cudaEventQuery(o->done);
    return e != cudaErrorNotReady;
}

/* c goes (aborted, or unwatched): each of its operations that has not
 * ended gets code and cause as its verdict, and all of them leave the
 * list. */
static void fail_ops(weft_nccl_comm *c, int code, const char *cause)
{
    for (op *o = w.head, *next; o; o = next) {
        next = o->next;
        if (o->comm != c)
            continue;
        if (!ended(o)) {
            o->code = code;
            snprintf(o->cause, sizeof o->cause, "%s", cause);
        }
        retire(o);
    }
}

/* Decide to abort c: verdicts given, `aborted` set; the caller aborts it
 * outside the lock, then calls abort_done. */
static void doom(weft_nccl_comm *c, int code, const char *cause)
{
    atomic_store(&c->aborted, true);
    c->aborting = true;
    fail_ops(c, code, cause);
}

static ncclResult_t abort_nc(weft_nccl_comm *c)
{
    int saved = -1;
    cudaError_t e = cudaGetDevice(&saved);
    if (e == cudaSuccess && saved != c->device)
        cudaSetDevice(c->device);
    ncclResult_t r = ncclCommAbort(c->nc);
    if (e == cudaSuccess && saved != c->device)
        cudaSetDevice(saved);
    return r;
}

static void abort_done(weft_nccl_comm *c)
{
    pthread_mutex_lock(&w.lock);
    c->aborting = false;
    pthread_cond_broadcast(&w.changed);
    pthread_mutex_unlock(&w.lock);
}

/* ---- the watcher ---------------------------------------------------------- */

/* One pass: retire what ended; return a communicator to abort (doomed), if
 * one failed or timed out. */
static weft_nccl_comm *poll_once(void)
{
    uint64_t now = weft_now_ns();
    w.pass++;
    for (op *o = w.head, *next; o; o = next) {
        next = o->next;
        if (ended(o))
            retire(o);
    }
    for (op *o = w.head; o; o = o->next) {
        weft_nccl_comm *c = o->comm;
        if (c->closing)
            continue;
        char cause[200];
        if (c->timeout_ns && now > o->since && now - o->since > c->timeout_ns) {
            snprintf(cause, sizeof cause,
                     "an operation was in flight over the communicator's timeout (%llu ms)",
                     (unsigned long long)(c->timeout_ns / 1000000));
            doom(c, WEFT_ETIMEDOUT, cause);
            return c;
        }
        if (c->polled == w.pass)
            continue;
        c->polled = w.pass;
        ncclResult_t state = ncclSuccess, r = ncclCommGetAsyncError(c->nc, &state);
        if (r == ncclSuccess)
            r = state;
        if (r != ncclSuccess && r != ncclInProgress) {
            const char *last = ncclGetLastError(c->nc);
            snprintf(cause, sizeof cause, "NCCL: %s%s%s", ncclGetErrorString(r),
                     last && *last ? ": " : "", last ? last : "");
            doom(c, WEFT_EDEVICE, cause);
            return c;
        }
    }
    return NULL;
}

static void *watch_loop(void *arg)
{
    (void)arg;
    uint64_t nap = NAP_MIN_NS;
    pthread_mutex_lock(&w.lock);
    while (!w.stopping) {
        if (!w.head) {
            pthread_cond_wait(&w.work, &w.lock);
            nap = NAP_MIN_NS;
            continue;
        }
        weft_nccl_comm *doomed = poll_once();
        pthread_mutex_unlock(&w.lock);
        if (doomed) {
            abort_nc(doomed);
            abort_done(doomed);
            nap = NAP_MIN_NS;
        } else {
            struct timespec ts = {0, (long)nap};
            nanosleep(&ts, NULL);
            nap = nap * 2 < NAP_MAX_NS ? nap * 2 : NAP_MAX_NS;
        }
        pthread_mutex_lock(&w.lock);
    }
    pthread_mutex_unlock(&w.lock);
    return NULL;
}

/* ---- communicators -------------------------------------------------------- */

int weft__nccl_watch_comm(const char *fn)
{
    pthread_mutex_lock(&w.lock);
    while (w.stopping)
        pthread_cond_wait(&w.changed, &w.lock);
    if (!w.running) {
        int e = pthread_create(&w.thread, NULL, watch_loop, NULL);
        if (e) {
            pthread_mutex_unlock(&w.lock);
            return weft__fail(WEFT_ENOMEM, "%s: the watcher thread could not start (%s)", fn,
                              strerror(e));
        }
        w.running = true;
    }
    w.comms++;
    pthread_mutex_unlock(&w.lock);
    return WEFT_OK;
}

bool weft__nccl_close(weft_nccl_comm *c)
{
    pthread_mutex_lock(&w.lock);
    c->closing = true;
    while (c->aborting)
        pthread_cond_wait(&w.changed, &w.lock);
    bool aborted = atomic_load(&c->aborted);
    pthread_mutex_unlock(&w.lock);
    return aborted;
}

void weft__nccl_unwatch_comm(weft_nccl_comm *c)
{
    pthread_mutex_lock(&w.lock);
    c->closing = true;
    while (c->aborting)
        pthread_cond_wait(&w.changed, &w.lock);
    fail_ops(c, WEFT_EDEVICE, "the communicator was destroyed first");
    bool last = --w.comms == 0;
    if (last) {
        w.stopping = true;
        pthread_cond_signal(&w.work);
    }
    pthread_mutex_unlock(&w.lock);
    if (!last)
        return;
    pthread_join(w.thread, NULL);
    pthread_mutex_lock(&w.lock);
    for (unsigned d = 0; d < POOL_DEVICES; d++)
        while (w.spare[d].n)
            cudaEventDestroy(w.spare[d].ev[--w.spare[d].n]);
    w.running = w.stopping = false;
    pthread_cond_broadcast(&w.changed);
    pthread_mutex_unlock(&w.lock);
}

bool weft__nccl_abort(weft_nccl_comm *c, int code, const char *cause, ncclResult_t *result)
{
    pthread_mutex_lock(&w.lock);
    bool mine = !atomic_load(&c->aborted) && !c->closing;
    if (mine)
        doom(c, code, cause);
    pthread_mutex_unlock(&w.lock);
    if (!mine)
        return false;
    ncclResult_t r = abort_nc(c);
    abort_done(c);
    if (result)
        *result = r;
    return true;
}

void weft__nccl_set_timeout(weft_nccl_comm *c, uint64_t ns)
{
    pthread_mutex_lock(&w.lock);
    c->timeout_ns = ns;
    pthread_mutex_unlock(&w.lock);
}

ncclResult_t weft__nccl_state(weft_nccl_comm *c, bool *aborted)
{
    pthread_mutex_lock(&w.lock);
    bool gone = atomic_load(&c->aborted);
    ncclResult_t state = ncclSuccess, r = ncclInvalidUsage;
    if (!gone && (r = ncclCommGetAsyncError(c->nc, &state)) == ncclSuccess)
        r = state;
    pthread_mutex_unlock(&w.lock);
    if (aborted)
        *aborted = gone;
    return r;
}

/* ---- operations ----------------------------------------------------------- */

/* The task's await check: the verdict, once its work has drained. */
static int op_check(void *arg)
{
    op *o = arg;
    pthread_mutex_lock(&w.lock);
    int code = o->code;
    char cause[sizeof o->cause];
    memcpy(cause, o->cause, sizeof cause);
    pthread_mutex_unlock(&w.lock);
    if (code == WEFT_OK)
        return WEFT_OK;
    return weft__fail(code, "%s: the communicator was aborted before it ended: %s", o->fn, cause);
}

static void op_release(void *arg)
{
    pthread_mutex_lock(&w.lock);
    op_put(arg);
    pthread_mutex_unlock(&w.lock);
}

int weft__nccl_watch_op(weft_nccl_comm *c, cudaStream_t stream, const char *fn)
{
    enum cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &capturing);
    if (e == cudaSuccess && capturing != cudaStreamCaptureStatusNone)
        return WEFT_OK; /* a graph's work: it runs at the graph's launch */
    op *o = e == cudaSuccess ? calloc(1, sizeof *o) : NULL;
    if (!o)
        goto fail;
    o->fn = fn;
    o->device = c->device;
    pthread_mutex_lock(&w.lock);
    if (c->device < POOL_DEVICES && w.spare[c->device].n)
        o->done = w.spare[c->device].ev[--w.spare[c->device].n];
    pthread_mutex_unlock(&w.lock);
    if (!o->done) {
        int saved = -1;
        if ((e = cudaGetDevice(&saved)) == cudaSuccess && saved != c->device)
            e = cudaSetDevice(c->device);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&o->done, cudaEventDisableTiming);
        if (saved >= 0 && saved != c->device)
            cudaSetDevice(saved);
    }
    if (e == cudaSuccess)
        e = cudaEventRecord(o->done, stream);
    if (e != cudaSuccess) {
        if (o->done)
            cudaEventDestroy(o->done);
        free(o);
        goto fail;
    }
    o->since = weft_now_ns();
    o->refs = 2;
    pthread_mutex_lock(&w.lock);
    if (atomic_load(&c->aborted) || c->closing) { /* gone while this was enqueued */
        o->code = WEFT_EDEVICE;
        snprintf(o->cause, sizeof o->cause, "it went as the operation was enqueued");
        o->refs = 1;
    } else {
        o->comm = c;
        o->next = w.head;
        if (w.head)
            w.head->prev = o;
        w.head = o;
        if (!o->next)
            pthread_cond_signal(&w.work); /* the watcher may be parked */
    }
    pthread_mutex_unlock(&w.lock);
    return weft__await_check_add(op_check, op_release, o);
fail:
    cudaGetLastError(); /* not sticky: clear it for the backend's checks */
    return weft__fail(WEFT_EDEVICE, "%s: an event to follow the operation: %s", fn,
                      cudaGetErrorName(e != cudaSuccess ? e : cudaErrorMemoryAllocation));
}

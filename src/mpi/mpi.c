/*
 * mpi.c - MPI requests awaited by tasks (include/weft/mpi.h).
 *
 * A task's await is a waiter parked on one list for the whole process (MPI
 * is one per process, and so are its requests), naming the caller's array
 * of requests and which of them are done. The list is a poll source of the
 * scheduler of every runtime set up with weft_mpi_init: idle workers, and a
 * watcher while every worker would otherwise sleep, call poll_requests,
 * which gathers the requests not yet done into one array, tests them all
 * with one MPI_Testsome, copies each completed request and its status back
 * into its waiter's arrays, and fires the waiters with nothing left. The
 * scheduler backs off while nothing completes and stops polling once the
 * list is empty.
 *
 * Invariants:
 *  - Everything a poller touches - the list, the waits' arrays, the
 *    scratch arrays - is guarded by requests.lock; a poller only try-locks
 *    it (another is polling), and holds it across MPI_Testsome, so that a
 *    wait that leaves (cancelled, timed out) and takes the lock finds its
 *    requests its own again.
 *  - The scratch arrays have room for every request not done on the list:
 *    a waiter makes that room before it links in, so a poller never
 *    allocates.
 *  - A wait is fired only with nothing left; a wait that left by itself
 *    (withdrawn) and finds it was unlinked by a firer has nothing left
 *    either, and counts as completed.
 *  - A thread (not a task) never links in: it tests its own requests,
 *    sleeping a little longer each time, up to a few tens of microseconds.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/lock.h"
#include "task/sched.h"
#include "task/task.h"
#include "task/tasks.h"
#include "task/wait.h"
#include "weft/mpi.h"

enum {
    INLINE_REQUESTS = 16, /* a wait's done flags kept in its record up to this many */
    THREAD_NAP_MIN_NS = 1000,
    THREAD_NAP_MAX_NS = 50000, /* a thread's test period at most */
};

/* One await: on the awaiting task's (or thread's) stack. */
typedef struct mpi_wait {
    weft__waiter w;
    int n, left;          /* requests, and those not yet done */
    MPI_Request *reqs;    /* the caller's */
    MPI_Status *statuses; /* the caller's, or NULL to ignore */
    unsigned char *done;  /* done[i]: request i completed (or failed) */
    int error, error_at;  /* the first MPI error, and whose; MPI_SUCCESS if none */
    unsigned char inline_done[INLINE_REQUESTS];
} mpi_wait;

/* Where a gathered request came from. */
typedef struct owner {
    mpi_wait *wait;
    int index;
} owner;

static struct {
    weft__lock lock;
    weft__waitq waits;
    atomic_uint nwaits; /* waits on the list, read without the lock */
    int nreqs;          /* requests not done over the list's waits */
    int cap;            /* room in each scratch array */
    MPI_Request *reqs;  /* the poller's scratch: gathered requests ... */
    owner *owners;      /* ... whose they are ... */
    int *indices;       /* ... and MPI_Testsome's answer */
    MPI_Status *statuses;
} requests = {.lock = WEFT__LOCK_INIT};

static pthread_mutex_t setup_lock = PTHREAD_MUTEX_INITIALIZER;

static mpi_wait *wait_of(weft__waiter *w)
{
    return (mpi_wait *)(void *)((char *)w - offsetof(mpi_wait, w));
}

/* Request i of m completed as req, with status st (NULL: none) and MPI
 * error code error. */
static void complete(mpi_wait *m, int i, MPI_Request req, const MPI_Status *st, int error)
{
    m->reqs[i] = req;
    if (m->statuses && st)
        m->statuses[i] = *st;
    if (error != MPI_SUCCESS && m->error == MPI_SUCCESS) {
        m->error = error;
        m->error_at = i;
    }
    m->done[i] = 1;
    m->left--;
}

/* Test request i of m once; true if it is done (completed or failed). */
static bool test_one(mpi_wait *m, int i)
{
    MPI_Status st;
    int flag = 0, rc = MPI_Test(&m->reqs[i], &flag, &st);
    if (rc != MPI_SUCCESS || flag)
        complete(m, i, m->reqs[i], flag ? &st : NULL, rc);
    return m->done[i];
}

/* Test every request of m not yet done. */
static void test_all(mpi_wait *m)
{
    for (int i = 0; i < m->n; i++)
        if (!m->done[i])
            test_one(m, i);
}

/* ---- the poll source --------------------------------------------------- */

/* Fire (and unlink) every wait with nothing left. Call with the lock held. */
static unsigned fire_completed(void)
{
    unsigned fired = 0;
    for (weft__waiter *w = requests.waits.head, *next; w; w = next) {
        next = w->next;
        if (wait_of(w)->left > 0)
            continue;
        weft__waitq_remove(&requests.waits, w);
        atomic_fetch_sub(&requests.nwaits, 1);
        weft__waiter_fire(w, WEFT_OK); /* refused only by a wait leaving: it sees left == 0 */
        fired++;
    }
    return fired;
}

/* Test every awaited request at once; fire the waits that completed. */
static unsigned poll_requests(void *ctx)
{
    (void)ctx;
    if (atomic_load_explicit(&requests.nwaits, memory_order_relaxed) == 0 ||
        !weft__lock_try(&requests.lock)) /* someone else is polling */
        return 0;
    int count = 0;
    for (weft__waiter *w = requests.waits.head; w; w = w->next) {
        mpi_wait *m = wait_of(w);
        for (int i = 0; i < m->n; i++) {
            if (m->done[i])
                continue;
            requests.reqs[count] = m->reqs[i];
            requests.owners[count++] = (owner){m, i};
        }
    }
    /* A test that completes nothing is made twice: Open MPI's progress in
     * a test can take in the message a receive waits for without completing
     * the receive before the next test, which would otherwise come a
     * whole sleep of the watcher later (bench/mpi/bench_wake.c). */
    int out = 0, rc = MPI_SUCCESS;
    for (int test = 0; count > 0 && test < 2; test++) {
        rc = MPI_Testsome(count, requests.reqs, &out, requests.indices, requests.statuses);
        if (rc != MPI_SUCCESS || (out != 0 && out != MPI_UNDEFINED))
            break;
    }
    if (rc == MPI_SUCCESS || rc == MPI_ERR_IN_STATUS) {
        for (int k = 0; out != MPI_UNDEFINED && k < out; k++) {
            int j = requests.indices[k];
            int error = rc == MPI_ERR_IN_STATUS ? requests.statuses[k].MPI_ERROR : MPI_SUCCESS;
            complete(requests.owners[j].wait, requests.owners[j].index, requests.reqs[j],
                     &requests.statuses[k], error);
            requests.nreqs--;
        }
    } else {
        /* MPI could not say which request failed: each is tested alone. */
        for (int j = 0; j < count; j++)
            if (test_one(requests.owners[j].wait, requests.owners[j].index))
                requests.nreqs--;
    }
    unsigned fired = fire_completed();
    weft__lock_release(&requests.lock);
    return fired;
}

static bool requests_pending(void *ctx)
{
    (void)ctx;
    return atomic_load_explicit(&requests.nwaits, memory_order_relaxed) > 0;
}

/* Room in the scratch arrays for n more requests. Call with the lock held. */
static int reserve(int n)
{
    if (requests.nreqs + n <= requests.cap)
        return WEFT_OK;
    int cap = requests.cap ? requests.cap : 64;
    while (cap < requests.nreqs + n)
        cap *= 2;
    MPI_Request *reqs = realloc(requests.reqs, (size_t)cap * sizeof *reqs);
    if (reqs)
        requests.reqs = reqs;
    owner *owners = realloc(requests.owners, (size_t)cap * sizeof *owners);
    if (owners)
        requests.owners = owners;
    int *indices = realloc(requests.indices, (size_t)cap * sizeof *indices);
    if (indices)
        requests.indices = indices;
    MPI_Status *statuses = realloc(requests.statuses, (size_t)cap * sizeof *statuses);
    if (statuses)
        requests.statuses = statuses;
    if (!reqs || !owners || !indices || !statuses)
        return WEFT_ENOMEM;
    requests.cap = cap;
    return WEFT_OK;
}

/* ---- waiting ----------------------------------------------------------- */

/* Park the calling task on the list until m has nothing left, deadline
 * passes or (if cancellable) the task is cancelled; returns how it ended. */
static int park(mpi_wait *m, weft__sched *sched, bool cancellable, uint64_t deadline)
{
    weft__waiter_init(&m->w, WEFT__WAITS_OTHER);
    weft__lock_acquire(&requests.lock);
    if (reserve(m->left) != WEFT_OK) {
        weft__lock_release(&requests.lock);
        return WEFT_ENOMEM;
    }
    weft__waitq_push(&requests.waits, &m->w);
    requests.nreqs += m->left;
    atomic_fetch_add(&requests.nwaits, 1);
    weft__sched_kick(sched); /* every worker may be asleep: get one polling */
    int rc = weft__waiter_wait_until(&m->w, &requests.lock, cancellable, deadline);
    if (weft__wait_withdrawn(rc)) {
        weft__lock_acquire(&requests.lock);
        if (m->w.linked) {
            weft__waitq_remove(&requests.waits, &m->w);
            requests.nreqs -= m->left;
            atomic_fetch_sub(&requests.nwaits, 1);
        }
        weft__lock_release(&requests.lock);
    }
    return rc;
}

/* A cancelled task's wait: cancel what is left, then wait for it to
 * complete, not cancellably, until deadline. */
static int cancel_rest(mpi_wait *m, weft__sched *sched, uint64_t deadline)
{
    for (int i = 0; i < m->n; i++)
        if (!m->done[i] && m->reqs[i] != MPI_REQUEST_NULL)
            MPI_Cancel(&m->reqs[i]);
    test_all(m);
    int rc = m->left > 0 ? park(m, sched, false, deadline) : WEFT_OK;
    return rc == WEFT_OK || m->left == 0 ? WEFT_ECANCELED : rc;
}

static int task_wait(weft__task *t, mpi_wait *m, uint64_t deadline, const char *fn)
{
    weft__sched *sched = weft__runtime_sched(t->rt);
    if (!weft__sched_polls(sched, WEFT__POLL_MESSAGES))
        return weft__fail(WEFT_EINVAL,
                          "%s: the task's runtime was not set up for MPI "
                          "(weft_mpi_init)",
                          fn);
    int rc = weft__task_may_suspend(fn);
    if (rc)
        return rc;
    if (atomic_load(&t->cancelled)) {
        rc = WEFT_ECANCELED;
    } else {
        test_all(m); /* done already: no wait */
        if (m->left == 0)
            return WEFT_OK;
        rc = deadline <= weft__now_ns() ? WEFT_ETIMEDOUT : park(m, sched, true, deadline);
    }
    if (rc == WEFT_ECANCELED && m->left > 0)
        rc = cancel_rest(m, sched, deadline);
    else if (rc != WEFT_OK && rc != WEFT_ECANCELED && m->left == 0)
        rc = WEFT_OK; /* a firer got there as the wait was leaving */
    return rc;
}

/* A plain thread tests the requests itself, napping between rounds. */
static int thread_wait(mpi_wait *m, uint64_t deadline)
{
    uint64_t nap = THREAD_NAP_MIN_NS;
    for (;;) {
        test_all(m);
        if (m->left == 0)
            return WEFT_OK;
        uint64_t now = weft__now_ns();
        if (now >= deadline)
            return WEFT_ETIMEDOUT;
        uint64_t ns = deadline - now < nap ? deadline - now : nap;
        struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        if (nap < THREAD_NAP_MAX_NS)
            nap *= 2;
    }
}

/* The message of a failed wait; returns rc. */
static int wait_failed(const mpi_wait *m, int rc, const char *fn)
{
    if (rc == WEFT_EDEVICE) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        if (MPI_Error_string(m->error, text, &len) != MPI_SUCCESS)
            snprintf(text, sizeof text, "error %d", m->error);
        return weft__fail(rc, "%s: MPI failed request %d: %s", fn, m->error_at, text);
    }
    if (rc == WEFT_ECANCELED)
        return weft__fail(rc,
                          "%s: task cancelled while waiting; its requests were cancelled "
                          "and completed",
                          fn);
    if (rc == WEFT_ETIMEDOUT)
        return weft__fail(rc, "%s: the deadline passed first; %d of %d requests still active", fn,
                          m->left, m->n);
    if (rc == WEFT_ENOMEM)
        return weft__fail(rc, "%s: out of memory to track %d requests", fn, m->n);
    return weft__wait_fail(rc, fn);
}

static int await_requests(int n, MPI_Request *reqs, MPI_Status *statuses, uint64_t deadline,
                          const char *fn)
{
    if (n < 0)
        return weft__fail(WEFT_EINVAL, "%s: n is %d", fn, n);
    if (!reqs && n > 0)
        return weft__fail(WEFT_EINVAL, "%s: reqs is NULL", fn);
    if (n == 0)
        return WEFT_OK;
    mpi_wait m = {.n = n,
                  .left = n,
                  .reqs = reqs,
                  .statuses = statuses == MPI_STATUS_IGNORE || statuses == MPI_STATUSES_IGNORE
                                  ? NULL
                                  : statuses,
                  .error = MPI_SUCCESS};
    m.done = n <= INLINE_REQUESTS ? m.inline_done : calloc((size_t)n, 1);
    if (!m.done)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory for %d requests", fn, n);
    memset(m.done, 0, (size_t)n);

    weft__task *t = weft__task_self();
    int rc = t ? task_wait(t, &m, deadline, fn) : thread_wait(&m, deadline);
    if (rc == WEFT_OK && m.error != MPI_SUCCESS)
        rc = WEFT_EDEVICE;
    if (rc != WEFT_OK && rc != WEFT_EINVAL)
        rc = wait_failed(&m, rc, fn);
    if (m.done != m.inline_done)
        free(m.done);
    return rc;
}

/* ---- the public calls -------------------------------------------------- */

int weft_mpi_init(weft_runtime *rt)
{
    int rc = weft__runtime_enter(rt, "weft_mpi_init");
    if (rc)
        return rc;
    int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) {
        rc = weft__fail(WEFT_EINVAL,
                        "weft_mpi_init: MPI is %s (MPI_Init_thread with "
                        "MPI_THREAD_MULTIPLE first)",
                        finalized ? "finalized" : "not initialised");
        goto out;
    }
    MPI_Query_thread(&provided);
    if (provided != MPI_THREAD_MULTIPLE) {
        const char *level = provided == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
                            : provided == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
                            : provided == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                                                : "an unknown level";
        rc = weft__fail(WEFT_EINVAL,
                        "weft_mpi_init: MPI provides %s, not MPI_THREAD_MULTIPLE: "
                        "workers call MPI from any thread",
                        level);
        goto out;
    }
    pthread_mutex_lock(&setup_lock);
    weft__sched *sched = weft__runtime_sched(rt);
    if (!weft__sched_polls(sched, WEFT__POLL_MESSAGES))
        weft__sched_set_poller(sched, WEFT__POLL_MESSAGES, poll_requests, requests_pending, NULL);
    pthread_mutex_unlock(&setup_lock);
out:
    weft__runtime_leave(rt);
    return rc;
}

int weft_mpi_await_until(MPI_Request *req, MPI_Status *status, uint64_t deadline_ns)
{
    if (!req)
        return weft__fail(WEFT_EINVAL, "weft_mpi_await: req is NULL");
    return await_requests(1, req, status, deadline_ns, "weft_mpi_await");
}

int weft_mpi_await(MPI_Request *req, MPI_Status *status)
{
    return weft_mpi_await_until(req, status, WEFT_FOREVER);
}

int weft_mpi_await_all_until(int n, MPI_Request reqs[], MPI_Status statuses[], uint64_t deadline_ns)
{
    return await_requests(n, reqs, statuses, deadline_ns, "weft_mpi_await_all");
}

int weft_mpi_await_all(int n, MPI_Request reqs[], MPI_Status statuses[])
{
    return weft_mpi_await_all_until(n, reqs, statuses, WEFT_FOREVER);
}

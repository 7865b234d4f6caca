/*
 * blocking.c - weft_blocking: run a call that blocks (a read from a slow
 * disk, a library that sleeps) on a thread allowed to block, while the
 * calling task suspends and its worker runs other tasks.
 *
 * Each runtime has a pool of at most `max` such threads, started lazily: a
 * job queued while no thread is idle starts one, until the bound; beyond it
 * jobs wait in FIFO order for a thread to come free. Threads are kept until
 * the runtime is destroyed.
 *
 * A job lives on the calling task's stack, and its function may point into
 * that stack too. Invariants, under the pool's lock:
 *  - A job is queued, taken (started: a thread runs its function, the lock
 *    let go meanwhile), or done. Only a thread moves it from taken to done,
 *    and it fires the job's waiter while still holding the lock, then never
 *    touches the job again.
 *  - The caller's parker is armed before the job can be seen, so the thread
 *    never fires a waiter it may not fire (task/wait.h). The first wait is
 *    cancellable; if cancellation wins it, the caller takes the lock: a job
 *    still queued leaves the queue and never runs (WEFT_ECANCELED); a job
 *    already taken cannot be interrupted, so the caller arms again, not
 *    cancellable, and waits for done. Either way it returns only once no
 *    thread will look at the job again.
 */
#include <stdlib.h>

#include "core/error.h"
#include "task/blocking.h"
#include "task/task.h"
#include "task/tasks.h"
#include "task/wait.h"
#include "weft.h"

enum { DEFAULT_THREADS = 16 };

typedef struct weft__blocking_job {
    struct weft__blocking_job *next;
    void *(*fn)(void *arg);
    void *arg;
    void *result;
    bool started, done;
    weft__waiter waiter;
} job;

void weft__blocking_init(weft__blocking *b, unsigned max)
{
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->work, NULL);
    b->head = b->tail = NULL;
    b->queued = b->idle = b->nthreads = 0;
    b->max = max ? max : DEFAULT_THREADS;
    b->threads = NULL;
    b->stopping = false;
}

void weft__blocking_fini(weft__blocking *b)
{
    pthread_mutex_lock(&b->lock);
    b->stopping = true;
    pthread_cond_broadcast(&b->work);
    pthread_mutex_unlock(&b->lock);
    for (unsigned i = 0; i < b->nthreads; i++)
        pthread_join(b->threads[i], NULL);
    free(b->threads);
    b->threads = NULL;
    b->nthreads = 0;
    pthread_cond_destroy(&b->work);
    pthread_mutex_destroy(&b->lock);
}

/* Take the oldest job. Call with the lock held and the queue not empty. */
static job *take(weft__blocking *b)
{
    job *j = b->head;
    b->head = j->next;
    if (!b->head)
        b->tail = NULL;
    b->queued--;
    j->started = true;
    return j;
}

static void *thread_main(void *arg)
{
    weft__blocking *b = arg;
    pthread_mutex_lock(&b->lock);
    for (;;) {
        while (!b->head && !b->stopping) {
            b->idle++;
            pthread_cond_wait(&b->work, &b->lock);
            b->idle--;
        }
        if (!b->head)
            break; /* stopping, and nothing left: no caller can be waiting */
        job *j = take(b);
        pthread_mutex_unlock(&b->lock);
        void *result = j->fn(j->arg);
        pthread_mutex_lock(&b->lock);
        j->result = result;
        j->done = true;
        weft__waiter_fire(&j->waiter, WEFT_OK); /* refused only if cancelled: it re-arms */
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

/* Make sure some thread will take the job just queued. Call with the lock
 * held. Fails only when no thread exists and none can be started. */
static int find_thread(weft__blocking *b)
{
    if (b->idle >= b->queued) {
        pthread_cond_signal(&b->work);
        return WEFT_OK;
    }
    if (b->nthreads == b->max)
        return WEFT_OK; /* the bound: it waits for a busy thread */
    if (!b->threads && !(b->threads = calloc(b->max, sizeof *b->threads)))
        return weft__fail(WEFT_ENOMEM, "weft_blocking: no memory for the thread pool");
    if (pthread_create(&b->threads[b->nthreads], NULL, thread_main, b)) {
        if (b->nthreads > 0)
            return WEFT_OK; /* a busy thread will take it */
        return weft__fail(WEFT_ESYS, "weft_blocking: cannot start a thread");
    }
    pthread_setname_np(b->threads[b->nthreads], "weft-blocking");
    b->nthreads++;
    return WEFT_OK;
}

static void unqueue(weft__blocking *b, job *j)
{
    job **link = &b->head, *prev = NULL;
    while (*link != j) {
        prev = *link;
        link = &(*link)->next;
    }
    *link = j->next;
    if (b->tail == j)
        b->tail = prev;
    b->queued--;
}

/* Queue j and suspend until it is done, or cancelled before it started. */
static int run_on_pool(weft__blocking *b, job *j)
{
    weft__parker *p = j->waiter.parker;

    pthread_mutex_lock(&b->lock);
    j->next = NULL;
    if (b->tail)
        b->tail->next = j;
    else
        b->head = j;
    b->tail = j;
    b->queued++;
    int rc = find_thread(b);
    if (rc) {
        unqueue(b, j);
        pthread_mutex_unlock(&b->lock);
        return rc;
    }
    weft__parker_arm(p, true, WEFT__WAITS_BLOCKING);
    pthread_mutex_unlock(&b->lock);
    if (weft__parker_park(p, NULL) == WEFT_OK)
        return WEFT_OK;

    /* Cancelled: drop the job if no thread has it, else wait it out. */
    pthread_mutex_lock(&b->lock);
    if (!j->started) {
        unqueue(b, j);
        pthread_mutex_unlock(&b->lock);
        return WEFT_ECANCELED;
    }
    if (j->done) {
        pthread_mutex_unlock(&b->lock);
        return WEFT_OK;
    }
    weft__parker_arm(p, false, WEFT__WAITS_BLOCKING);
    pthread_mutex_unlock(&b->lock);
    return weft__parker_park(p, NULL);
}

int weft_blocking(void *(*fn)(void *arg), void *arg, void **result)
{
    if (!fn)
        return weft__fail(WEFT_EINVAL, "weft_blocking: fn is NULL");
    weft__task *t = weft__task_self();
    if (!t) { /* a plain thread may block: just call it */
        void *r = fn(arg);
        if (result)
            *result = r;
        return WEFT_OK;
    }
    if (atomic_load(&t->cancelled))
        return weft__fail(WEFT_ECANCELED, "weft_blocking: task cancelled; fn not run");
    int rc = weft__task_may_suspend("weft_blocking");
    if (rc)
        return rc;

    job j = {.fn = fn, .arg = arg};
    weft__waiter_init(&j.waiter, WEFT__WAITS_BLOCKING);
    rc = run_on_pool(&weft__tasks_of(t->rt)->blocking, &j);
    if (rc == WEFT_ECANCELED)
        return weft__fail(rc, "weft_blocking: task cancelled before fn started; fn not run");
    if (rc)
        return rc;
    if (result)
        *result = j.result;
    return WEFT_OK;
}

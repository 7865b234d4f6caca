/*
 * sync.c - task-aware mutex, condition variable and counting semaphore.
 *
 * Each object is a weft__lock guarding a little state and a FIFO of waiters,
 * and every wait follows the protocol of task/wait.h: a task that must wait
 * parks on the object's queue and its worker runs other tasks; a plain
 * thread blocks. Nothing here allocates after create.
 *
 * Invariants, all under the object's lock:
 *  - mutex: owner == 0 iff the mutex is free. unlock hands ownership straight
 *    to the first live waiter (the waiter is the owner before it even runs),
 *    so a free mutex has no live waiter and a newcomer never barges past one.
 *  - sem: count > 0 implies no live waiter, for the same reason: post gives
 *    its permit to the first live waiter and only bumps count without one.
 *  - cond: no state but its queue. A waiter is linked before it releases the
 *    mutex, so a signal sent by anyone who takes the mutex after that
 *    release finds it.
 *  - A queue may still hold a waiter whose wait ended by cancellation or by
 *    its deadline: it unlinks itself once it retakes the lock.
 *    weft__waiter_fire refuses it, and the firer passes what it carried
 *    (ownership, a permit, a wake-up) on to the next waiter. So a timed-out
 *    wait took nothing, and nothing it was offered is lost.
 *
 * The caller's identity (mutex ownership) is its task handle inside a task,
 * so a task may lock on one worker and unlock on another, and its pthread
 * id, tagged with the low bit so that it can never equal a task handle,
 * outside tasks.
 */
#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/lock.h"
#include "task/task.h"
#include "task/wait.h"
#include "weft.h"

struct weft_mutex {
    weft__lock lock;
    uintptr_t owner;     /* caller_identity() of the holder; 0: free */
    weft__waitq waiters; /* w->data: the waiter's identity */
};

struct weft_cond {
    weft__lock lock;
    weft__waitq waiters;
};

struct weft_sem {
    weft__lock lock;
    uint64_t count;
    weft__waitq waiters;
};

/* Who is calling: the task, or the thread outside tasks. Never 0. */
static uintptr_t caller_identity(void)
{
    weft_task *t = weft_task_current();

    if (t != NULL)
        return (uintptr_t)t;
    return (uintptr_t)pthread_self() | 1u;
}

/* ---- mutex ------------------------------------------------------------- */

int weft_mutex_create(weft_mutex **m)
{
    weft_mutex *mu;

    if (m == NULL)
        return weft__fail(WEFT_EINVAL, "weft_mutex_create: m is NULL");
    *m = NULL;
    mu = calloc(1, sizeof(*mu));
    if (mu == NULL)
        return weft__fail(WEFT_ENOMEM, "weft_mutex_create: out of memory");
    *m = mu;
    return WEFT_OK;
}

int weft_mutex_destroy(weft_mutex *m)
{
    bool busy;

    if (m == NULL)
        return weft__fail(WEFT_EINVAL, "weft_mutex_destroy: m is NULL");
    weft__lock_acquire(&m->lock);
    busy = m->owner != 0 || m->waiters.head != NULL;
    weft__lock_release(&m->lock);
    if (busy)
        return weft__fail(WEFT_ESTATE, "weft_mutex_destroy: mutex is held or waited on");
    free(m);
    return WEFT_OK;
}

/* Take m for self, waiting behind earlier waiters until deadline. Returns
 * WEFT_OK (held), WEFT_EDEADLK (self holds it already), or WEFT_ECANCELED,
 * WEFT_ETIMEDOUT, WEFT_ENOMEM (not held). */
static int mutex_acquire(weft_mutex *m, uintptr_t self, bool cancellable, uint64_t deadline)
{
    weft__waiter w;

    weft__lock_acquire(&m->lock);
    if (m->owner == 0) {
        m->owner = self;
        weft__lock_release(&m->lock);
        return WEFT_OK;
    }
    if (m->owner == self) {
        weft__lock_release(&m->lock);
        return WEFT_EDEADLK;
    }
    weft__waiter_init(&w, WEFT__WAITS_MUTEX);
    w.data = (void *)self;
    weft__waitq_push(&m->waiters, &w);
    /* WEFT_OK: the unlocker made us the owner before firing. */
    return weft__waitq_park_until(&m->waiters, &w, &m->lock, cancellable, deadline);
}

/* Give m up, handing it to the first live waiter. Call with m->lock held. */
static int mutex_release_locked(weft_mutex *m, uintptr_t self)
{
    weft__waiter *w;

    if (m->owner != self)
        return WEFT_EPERM;
    m->owner = 0;
    while ((w = weft__waitq_pop(&m->waiters)) != NULL) {
        uintptr_t next = (uintptr_t)w->data; /* w may vanish once fired */

        if (weft__waiter_fire(w, WEFT_OK)) {
            m->owner = next;
            break;
        }
    }
    return WEFT_OK;
}

static int mutex_release(weft_mutex *m, uintptr_t self)
{
    int status;

    weft__lock_acquire(&m->lock);
    status = mutex_release_locked(m, self);
    weft__lock_release(&m->lock);
    return status;
}

static int mutex_lock(weft_mutex *m, uint64_t deadline, const char *fn)
{
    int status;

    if (m == NULL)
        return weft__fail(WEFT_EINVAL, "%s: m is NULL", fn);
    if (weft_cancelled())
        return weft__fail(WEFT_ECANCELED, "%s: task cancelled", fn);
    if ((status = weft__task_may_suspend(fn)))
        return status;
    status = mutex_acquire(m, caller_identity(), true, deadline);
    if (status == WEFT_EDEADLK)
        return weft__fail(status, "%s: caller already holds the mutex", fn);
    if (status != WEFT_OK)
        return weft__wait_fail(status, fn);
    return WEFT_OK;
}

int weft_mutex_lock(weft_mutex *m)
{
    return mutex_lock(m, WEFT_FOREVER, "weft_mutex_lock");
}

int weft_mutex_lock_until(weft_mutex *m, uint64_t deadline_ns)
{
    return mutex_lock(m, deadline_ns, "weft_mutex_lock_until");
}

int weft_mutex_trylock(weft_mutex *m)
{
    uintptr_t self;
    bool taken = false;

    if (m == NULL)
        return weft__fail(WEFT_EINVAL, "weft_mutex_trylock: m is NULL");
    self = caller_identity();
    weft__lock_acquire(&m->lock);
    if (m->owner == 0) {
        m->owner = self;
        taken = true;
    }
    weft__lock_release(&m->lock);
    if (!taken)
        return weft__fail(WEFT_EAGAIN, "weft_mutex_trylock: mutex is held");
    return WEFT_OK;
}

int weft_mutex_unlock(weft_mutex *m)
{
    if (m == NULL)
        return weft__fail(WEFT_EINVAL, "weft_mutex_unlock: m is NULL");
    if (mutex_release(m, caller_identity()) != WEFT_OK)
        return weft__fail(WEFT_EPERM, "weft_mutex_unlock: caller does not hold the mutex");
    return WEFT_OK;
}

/* ---- condition variable ------------------------------------------------ */

int weft_cond_create(weft_cond **c)
{
    weft_cond *cv;

    if (c == NULL)
        return weft__fail(WEFT_EINVAL, "weft_cond_create: c is NULL");
    *c = NULL;
    cv = calloc(1, sizeof(*cv));
    if (cv == NULL)
        return weft__fail(WEFT_ENOMEM, "weft_cond_create: out of memory");
    *c = cv;
    return WEFT_OK;
}

int weft_cond_destroy(weft_cond *c)
{
    bool busy;

    if (c == NULL)
        return weft__fail(WEFT_EINVAL, "weft_cond_destroy: c is NULL");
    weft__lock_acquire(&c->lock);
    busy = c->waiters.head != NULL;
    weft__lock_release(&c->lock);
    if (busy)
        return weft__fail(WEFT_ESTATE, "weft_cond_destroy: tasks are waiting on it");
    free(c);
    return WEFT_OK;
}

static bool mutex_held_by(weft_mutex *m, uintptr_t self)
{
    bool held;

    weft__lock_acquire(&m->lock);
    held = m->owner == self;
    weft__lock_release(&m->lock);
    return held;
}

static int cond_wait(weft_cond *c, weft_mutex *m, uint64_t deadline, const char *fn)
{
    weft__waiter w;
    uintptr_t self;
    int status, relock;

    if (c == NULL)
        return weft__fail(WEFT_EINVAL, "%s: c is NULL", fn);
    if (m == NULL)
        return weft__fail(WEFT_EINVAL, "%s: m is NULL", fn);
    if ((status = weft__task_may_suspend(fn)))
        return status;
    self = caller_identity();
    if (!mutex_held_by(m, self))
        return weft__fail(WEFT_EPERM, "%s: caller does not hold the mutex", fn);
    if (weft_cancelled())
        return weft__fail(WEFT_ECANCELED, "%s: task cancelled", fn);

    /* Lock order: cond, then mutex. Linking before the release is what
     * makes "release m and wait" atomic for anyone who signals under m. */
    weft__waiter_init(&w, WEFT__WAITS_COND);
    weft__lock_acquire(&c->lock);
    weft__waitq_push(&c->waiters, &w);
    weft__lock_acquire(&m->lock);
    relock = mutex_release_locked(m, self);
    weft__lock_release(&m->lock);
    assert(relock == WEFT_OK);
    status = weft__waitq_park_until(&c->waiters, &w, &c->lock, true, deadline);

    /* Neither cancellable nor timed: the caller holds m on return, whatever
     * happened. */
    relock = mutex_acquire(m, self, false, WEFT_FOREVER);
    assert(relock == WEFT_OK);
    (void)relock;
    if (status != WEFT_OK)
        return weft__wait_fail(status, fn);
    return WEFT_OK;
}

int weft_cond_wait(weft_cond *c, weft_mutex *m)
{
    return cond_wait(c, m, WEFT_FOREVER, "weft_cond_wait");
}

int weft_cond_wait_until(weft_cond *c, weft_mutex *m, uint64_t deadline_ns)
{
    return cond_wait(c, m, deadline_ns, "weft_cond_wait_until");
}

int weft_cond_signal(weft_cond *c)
{
    if (c == NULL)
        return weft__fail(WEFT_EINVAL, "weft_cond_signal: c is NULL");
    weft__lock_acquire(&c->lock);
    weft__waitq_fire_one(&c->waiters, WEFT_OK);
    weft__lock_release(&c->lock);
    return WEFT_OK;
}

int weft_cond_broadcast(weft_cond *c)
{
    if (c == NULL)
        return weft__fail(WEFT_EINVAL, "weft_cond_broadcast: c is NULL");
    weft__lock_acquire(&c->lock);
    weft__waitq_fire_all(&c->waiters, WEFT_OK);
    weft__lock_release(&c->lock);
    return WEFT_OK;
}

/* ---- semaphore --------------------------------------------------------- */

int weft_sem_create(weft_sem **s, uint64_t initial)
{
    weft_sem *sem;

    if (s == NULL)
        return weft__fail(WEFT_EINVAL, "weft_sem_create: s is NULL");
    *s = NULL;
    sem = calloc(1, sizeof(*sem));
    if (sem == NULL)
        return weft__fail(WEFT_ENOMEM, "weft_sem_create: out of memory");
    sem->count = initial;
    *s = sem;
    return WEFT_OK;
}

int weft_sem_destroy(weft_sem *s)
{
    bool busy;

    if (s == NULL)
        return weft__fail(WEFT_EINVAL, "weft_sem_destroy: s is NULL");
    weft__lock_acquire(&s->lock);
    busy = s->waiters.head != NULL;
    weft__lock_release(&s->lock);
    if (busy)
        return weft__fail(WEFT_ESTATE, "weft_sem_destroy: tasks are waiting on it");
    free(s);
    return WEFT_OK;
}

static int sem_wait(weft_sem *s, uint64_t deadline, const char *fn)
{
    weft__waiter w;
    int status;

    if (s == NULL)
        return weft__fail(WEFT_EINVAL, "%s: s is NULL", fn);
    if (weft_cancelled())
        return weft__fail(WEFT_ECANCELED, "%s: task cancelled", fn);
    if ((status = weft__task_may_suspend(fn)))
        return status;
    weft__lock_acquire(&s->lock);
    if (s->count > 0) {
        s->count--;
        weft__lock_release(&s->lock);
        return WEFT_OK;
    }
    weft__waiter_init(&w, WEFT__WAITS_SEM);
    weft__waitq_push(&s->waiters, &w);
    /* WEFT_OK: a post handed us its permit. */
    status = weft__waitq_park_until(&s->waiters, &w, &s->lock, true, deadline);
    if (status != WEFT_OK)
        return weft__wait_fail(status, fn);
    return WEFT_OK;
}

int weft_sem_wait(weft_sem *s)
{
    return sem_wait(s, WEFT_FOREVER, "weft_sem_wait");
}

int weft_sem_wait_until(weft_sem *s, uint64_t deadline_ns)
{
    return sem_wait(s, deadline_ns, "weft_sem_wait_until");
}

int weft_sem_trywait(weft_sem *s)
{
    bool taken = false;

    if (s == NULL)
        return weft__fail(WEFT_EINVAL, "weft_sem_trywait: s is NULL");
    weft__lock_acquire(&s->lock);
    if (s->count > 0) {
        s->count--;
        taken = true;
    }
    weft__lock_release(&s->lock);
    if (!taken)
        return weft__fail(WEFT_EAGAIN, "weft_sem_trywait: no permit free");
    return WEFT_OK;
}

int weft_sem_post(weft_sem *s)
{
    int status = WEFT_OK;

    if (s == NULL)
        return weft__fail(WEFT_EINVAL, "weft_sem_post: s is NULL");
    weft__lock_acquire(&s->lock);
    if (!weft__waitq_fire_one(&s->waiters, WEFT_OK)) {
        if (s->count == UINT64_MAX)
            status = WEFT_ESTATE;
        else
            s->count++;
    }
    weft__lock_release(&s->lock);
    if (status != WEFT_OK)
        return weft__fail(status, "weft_sem_post: count would overflow");
    return WEFT_OK;
}

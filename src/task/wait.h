/*
 * wait.h - how anything in weft waits: a waiter, armed by the waiting task
 * (or thread) and fired by whoever ends the wait.
 *
 * Every blocking construct (join, channels, mutexes, timers, device markers)
 * keeps a list of waiters under its own weft__lock. The protocol:
 *
 *   waiter:  lock(L); ...decide to wait...;
 *            status = weft__waitq_wait(&q, &w, &L, cancellable);
 *            -- links w, arms the parker, releases L, suspends; if the wait
 *               was cancelled, unlinks w under L again before returning --
 *   firer:   lock(L); weft__waitq_fire_one(&q, WEFT_OK): pops waiters until
 *            one accepts (a cancelled one is leaving and refuses); unlock(L);
 *
 * Invariants:
 *  - The waiter's parker is armed before L is released, so a firer can
 *    never see a waiter it is not allowed to fire. A task waiter becomes
 *    schedulable only once its registers are saved: the worker moves the
 *    parker from ARMED to WAITING after the switch (task.h), and only a
 *    firer that finds WAITING schedules it.
 *  - Exactly one of {firer, cancel} wins a waiter; the loser does nothing to
 *    the task. A firer that loses must hand what it carried (a permit, an
 *    item) to another waiter.
 *  - The waiter lives on the waiting task's stack (or thread's), so the list
 *    owner may only touch it while holding L, and only until it fires it. A
 *    cancelled waiter takes L before leaving, so a firer holding L may still
 *    write into w->data before trying to fire it.
 *  - A timed wait (weft__waiter_wait_until) has one more firer: its deadline,
 *    which fires the same parker with WEFT_ETIMEDOUT (the runtime's timer
 *    thread for a task, the futex timeout for a thread). It races like
 *    cancel and leaves like cancel: a waiter whose wait was withdrawn
 *    (weft__wait_withdrawn) takes L and unlinks itself, and a firer that
 *    loses to it passes what it carried on. A deadline already past makes
 *    the wait a try: it ends at once, unless a firer won first.
 */
#ifndef WEFT_WAIT_H
#define WEFT_WAIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/lock.h"
#include "trace/trace.h"
#include "weft.h"

struct weft__parker;

typedef struct weft__waiter {
    struct weft__parker *parker; /* the waiting task's or thread's parker */
    struct weft__waiter *next;   /* list links, owned by the list's owner */
    struct weft__waiter *prev;
    void *data;                  /* for the list's owner, e.g. an item buffer */
    bool linked;                 /* for the list's owner */
    uint8_t waits_on;            /* what for: a weft__waits_on (trace/trace.h) */
} weft__waiter;

/* Bind w to the calling task, or to the calling thread outside tasks;
 * waits_on (a weft__waits_on) names what it will wait for in traces. */
void weft__waiter_init(weft__waiter *w, unsigned waits_on);

/* Suspend the calling task (or block the calling thread) until w fires.
 * lock, held by the caller, is released once w can be fired safely; it may
 * be NULL when nothing else guards w. A cancellable wait also ends when the
 * task is cancelled (returning WEFT_ECANCELED; see the protocol above); a
 * non-cancellable one ignores cancellation. Returns the fired status. */
int weft__waiter_wait(weft__waiter *w, weft__lock *lock, bool cancellable);

/* weft__waiter_wait that also ends at deadline (CLOCK_MONOTONIC
 * nanoseconds; WEFT_FOREVER: never) with WEFT_ETIMEDOUT, whether or not it
 * is cancellable. WEFT_ENOMEM: the deadline could not be set up (the wait
 * ended at once). */
int weft__waiter_wait_until(weft__waiter *w, weft__lock *lock, bool cancellable, uint64_t deadline);

/* Did the wait end other than by a list firer (cancelled, timed out, no
 * memory for its deadline)? Then w may still be linked. */
static inline bool weft__wait_withdrawn(int status)
{
    return status == WEFT_ECANCELED || status == WEFT_ETIMEDOUT || status == WEFT_ENOMEM;
}

/* Report a wait that ended with a withdrawn status (or any failure) as
 * fn's failure, with a message saying why; returns status. */
int weft__wait_fail(int status, const char *fn);

/* End w's wait with status. Returns false if w's wait already ended because
 * its task was cancelled. Call with the list's lock held. */
bool weft__waiter_fire(weft__waiter *w, int status);

/* ---- intrusive waiter list (FIFO), for list owners --------------------- */

typedef struct weft__waitq {
    weft__waiter *head, *tail;
} weft__waitq;

static inline void weft__waitq_push(weft__waitq *q, weft__waiter *w)
{
    w->next = NULL;
    w->prev = q->tail;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
    w->linked = true;
}

static inline void weft__waitq_remove(weft__waitq *q, weft__waiter *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        q->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        q->tail = w->prev;
    w->next = w->prev = NULL;
    w->linked = false;
}

static inline weft__waiter *weft__waitq_pop(weft__waitq *q)
{
    weft__waiter *w = q->head;
    if (w)
        weft__waitq_remove(q, w);
    return w;
}

/* Wait with w already linked on q, as the protocol above says, until
 * deadline at the latest. Call with lock held; returns with it released. */
static inline int weft__waitq_park_until(weft__waitq *q, weft__waiter *w, weft__lock *lock,
                                         bool cancellable, uint64_t deadline)
{
    int status = weft__waiter_wait_until(w, lock, cancellable, deadline);
    if (weft__wait_withdrawn(status)) {
        weft__lock_acquire(lock);
        if (w->linked)
            weft__waitq_remove(q, w);
        weft__lock_release(lock);
    }
    return status;
}

static inline int weft__waitq_park(weft__waitq *q, weft__waiter *w, weft__lock *lock,
                                   bool cancellable)
{
    return weft__waitq_park_until(q, w, lock, cancellable, WEFT_FOREVER);
}

/* Link w at the tail of q, then weft__waitq_park. */
static inline int weft__waitq_wait(weft__waitq *q, weft__waiter *w, weft__lock *lock,
                                   bool cancellable)
{
    weft__waitq_push(q, w);
    return weft__waitq_park(q, w, lock, cancellable);
}

/* Pop waiters until one accepts status. Returns false when the queue held
 * no live waiter. (A fired waiter may vanish at once: never touch it after.) */
static inline bool weft__waitq_fire_one(weft__waitq *q, int status)
{
    weft__waiter *w;
    while ((w = weft__waitq_pop(q)) != NULL)
        if (weft__waiter_fire(w, status))
            return true;
    return false;
}

/* Fire every live waiter with status. */
static inline void weft__waitq_fire_all(weft__waitq *q, int status)
{
    while (weft__waitq_fire_one(q, status))
        ;
}

#endif

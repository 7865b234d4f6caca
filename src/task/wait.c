/*
 * wait.c - parkers and waiters: how a wait ends, exactly once.
 *
 * See task.h for the parker's phases. A task parker suspends the task (the
 * scheduler moves it from ARMED to WAITING once its registers are saved); a
 * thread parker blocks the thread on a futex. The status a wait ends with
 * travels in the same word as the phase, so one CAS both decides the winner
 * and publishes its status.
 *
 * A deadline is one more firer. A task's goes into its runtime's timer heap
 * (timer.c) before the lock is released and comes out before the wait
 * returns, so it can never fire a later wait of the same parker; a thread
 * bounds its futex sleeps by the deadline and, once it has passed, fires
 * its own parker. Either way the CAS decides: a firer that got there first
 * wins, and the waiter sees its status.
 */
#include "core/clock.h"
#include "core/futex.h"
#include "task/sched.h"
#include "task/task.h"
#include "task/tasks.h"

static _Thread_local weft__parker thread_parker;

__attribute__((noinline)) static weft__parker *thread_parker_self(void)
{
    return &thread_parker;
}

weft__parker *weft__parker_self(void)
{
    weft__task *t = weft__task_self();
    return t ? &t->parker : thread_parker_self();
}

static unsigned phase(unsigned state)
{
    return state & WEFT__PARK_PHASE;
}

static int status_of(unsigned state)
{
    return -(int)(state >> WEFT__PARK_STATUS_SHIFT);
}

void weft__parker_arm(weft__parker *p, bool cancellable, unsigned waits_on)
{
    p->waits_on = (uint8_t)waits_on;
    atomic_store(&p->state, WEFT__PARK_ARMED | (cancellable ? WEFT__PARK_CANCELLABLE : 0));
}

/* A cancellable wait armed after weft_cancel must not sleep: withdraw it,
 * unless a firer won first (then its status stands). */
static bool withdraw_if_cancelled(weft__parker *p)
{
    unsigned st = atomic_load(&p->state);
    if (!(st & WEFT__PARK_CANCELLABLE) || !p->task || !atomic_load(&p->task->cancelled))
        return false;
    return phase(st) == WEFT__PARK_ARMED &&
           atomic_compare_exchange_strong(&p->state, &st, WEFT__PARK_RUNNING);
}

/* Block the calling thread while p is WAITING, until deadline at most. */
static void thread_block(weft__parker *p, unsigned waiting, uint64_t deadline)
{
    while (phase(atomic_load(&p->state)) == WEFT__PARK_WAITING) {
        if (deadline == WEFT_FOREVER) {
            weft__futex_wait(&p->state, waiting, NULL);
            continue;
        }
        uint64_t now = weft__now_ns();
        if (now >= deadline) {
            weft__parker_notify(p, WEFT_ETIMEDOUT, false); /* loses to a firer first */
            continue;
        }
        uint64_t left = deadline - now;
        struct timespec ts = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
        weft__futex_wait(&p->state, waiting, &ts);
    }
}

static int park(weft__parker *p, weft__lock *lock, uint64_t deadline)
{
    if (lock)
        weft__lock_release(lock);
    if (withdraw_if_cancelled(p))
        return WEFT_ECANCELED;

    unsigned st = atomic_load(&p->state);
    if (phase(st) != WEFT__PARK_NOTIFIED) {
        if (p->task) {
            weft__sched_leave(p->task, WEFT__LEAVE_PARK);
        } else if (atomic_compare_exchange_strong(
                       &p->state, &st, (st & ~WEFT__PARK_PHASE) | WEFT__PARK_WAITING)) {
            thread_block(p, (st & ~WEFT__PARK_PHASE) | WEFT__PARK_WAITING, deadline);
        }
        st = atomic_load(&p->state);
    }
    atomic_store_explicit(&p->state, WEFT__PARK_RUNNING, memory_order_relaxed);
    return status_of(st);
}

int weft__parker_park(weft__parker *p, weft__lock *lock)
{
    return park(p, lock, WEFT_FOREVER);
}

int weft__parker_park_until(weft__parker *p, weft__lock *lock, uint64_t deadline)
{
    if (deadline == WEFT_FOREVER)
        return park(p, lock, deadline);
    if (deadline <= weft__now_ns()) { /* a try: end it now, unless a firer won */
        weft__parker_notify(p, WEFT_ETIMEDOUT, false);
        return park(p, lock, deadline);
    }
    if (!p->task)
        return park(p, lock, deadline);

    weft__timers *timers = weft__tasks_of(p->task->rt)->timers;
    weft__timer timer = {.deadline = deadline,
                         .status = WEFT_ETIMEDOUT,
                         .waiter = {.parker = p, .waits_on = p->waits_on}};
    if (weft__timers_add(timers, &timer) != WEFT_OK) {
        weft__parker_notify(p, WEFT_ENOMEM, false);
        return park(p, lock, WEFT_FOREVER);
    }
    int status = park(p, lock, WEFT_FOREVER);
    weft__timers_remove(timers, &timer);
    return status;
}

bool weft__parker_notify(weft__parker *p, int status, bool cancel)
{
    unsigned notified = WEFT__PARK_NOTIFIED | ((unsigned)-status << WEFT__PARK_STATUS_SHIFT);
    unsigned st = atomic_load(&p->state);
    for (;;) {
        unsigned ph = phase(st);
        if (ph != WEFT__PARK_ARMED && ph != WEFT__PARK_WAITING)
            return false;
        if (cancel && !(st & WEFT__PARK_CANCELLABLE))
            return false;
        if (atomic_compare_exchange_weak(&p->state, &st, notified))
            break;
    }
    if (weft__trace_on() && p->task)
        weft__trace_woken(p->task);
    if (phase(st) == WEFT__PARK_WAITING) {
        if (p->task)
            weft__sched_wake(weft__runtime_sched(p->task->rt), p->task);
        else
            weft__futex_wake(&p->state, 1);
    }
    return true;
}

void weft__waiter_init(weft__waiter *w, unsigned waits_on)
{
    w->parker = weft__parker_self();
    w->next = w->prev = NULL;
    w->data = NULL;
    w->linked = false;
    w->waits_on = (uint8_t)waits_on;
}

int weft__waiter_wait(weft__waiter *w, weft__lock *lock, bool cancellable)
{
    weft__parker_arm(w->parker, cancellable, w->waits_on);
    return weft__parker_park(w->parker, lock);
}

int weft__waiter_wait_until(weft__waiter *w, weft__lock *lock, bool cancellable, uint64_t deadline)
{
    weft__parker_arm(w->parker, cancellable, w->waits_on);
    return weft__parker_park_until(w->parker, lock, deadline);
}

bool weft__waiter_fire(weft__waiter *w, int status)
{
    return weft__parker_notify(w->parker, status, false);
}

int weft__wait_fail(int status, const char *fn)
{
    switch (status) {
    case WEFT_ECANCELED:
        return weft__fail(status, "%s: task cancelled while waiting", fn);
    case WEFT_ETIMEDOUT:
        return weft__fail(status, "%s: the deadline passed first", fn);
    case WEFT_ENOMEM:
        return weft__fail(status, "%s: no memory to set up the deadline", fn);
    default:
        return weft__fail(status, "%s: %s", fn, weft_strerror(status));
    }
}

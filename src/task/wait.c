/*
 * wait.c - parkers and waiters: how a wait ends, exactly once.
 *
 * See task.h for the parker's phases. A task parker suspends the task (the
 * scheduler moves it from ARMED to WAITING once its registers are saved); a
 * thread parker blocks the thread on a futex. The status a wait ends with
 * travels in the same word as the phase, so one CAS both decides the winner
 * and publishes its status.
 */
#include "core/futex.h"
#include "runtime.h"
#include "sched/sched.h"
#include "task/task.h"

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

int weft__parker_park(weft__parker *p, weft__lock *lock)
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
            st = (st & ~WEFT__PARK_PHASE) | WEFT__PARK_WAITING;
            while (phase(atomic_load(&p->state)) == WEFT__PARK_WAITING)
                weft__futex_wait(&p->state, st, NULL);
        }
        st = atomic_load(&p->state);
    }
    atomic_store_explicit(&p->state, WEFT__PARK_RUNNING, memory_order_relaxed);
    return status_of(st);
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

bool weft__waiter_fire(weft__waiter *w, int status)
{
    return weft__parker_notify(w->parker, status, false);
}

/*
 * calls.c - the gate every public call on a runtime passes (see tasks.h).
 *
 * A call from outside rt's tasks is counted while rt is open, so destroy
 * can wait for the calls in progress; a call from one of rt's own tasks is
 * not counted (destroy waits for the task anyway), so spawns and joins from
 * tasks touch no shared atomic. The gate's words live in the task layer's
 * share of the runtime record, which is never freed.
 */
#include "core/error.h"
#include "task/tasks.h"

static int refused(weft_runtime *rt, const char *fn)
{
    weft__tasks *tk = weft__tasks_of(rt);
    if (atomic_load_explicit(&tk->state, memory_order_relaxed) == WEFT__RT_DYING)
        return weft__fail(WEFT_ESTATE, "%s: the runtime is being destroyed", fn);
    return weft__fail(WEFT_ESTATE, "%s: the runtime was destroyed", fn);
}

static bool own_task(weft_runtime *rt)
{
    weft__task *self = weft__task_self();
    return self && self->rt == rt;
}

int weft__runtime_enter(weft_runtime *rt, const char *fn)
{
    if (!rt)
        return weft__fail(WEFT_EINVAL, "%s: runtime is NULL", fn);
    if (own_task(rt))
        return WEFT_OK; /* rt lives at least as long as the caller */
    weft__tasks *tk = weft__tasks_of(rt);
    /* Counted only while open: destroy clears OPEN, so the count it then
     * waits for can only fall, however many callers keep trying. */
    unsigned calls = atomic_load_explicit(&tk->calls, memory_order_relaxed);
    do {
        if (!(calls & WEFT__RT_OPEN))
            return refused(rt, fn);
    } while (!atomic_compare_exchange_weak_explicit(&tk->calls, &calls, calls + 1,
                                                    memory_order_acquire, memory_order_relaxed));
    return WEFT_OK;
}

void weft__runtime_leave(weft_runtime *rt)
{
    weft__tasks *tk = weft__tasks_of(rt);
    if (own_task(rt))
        return;
    /* Release: destroy sees everything the call did before it frees. */
    unsigned calls = atomic_load_explicit(&tk->calls, memory_order_relaxed);
    while (calls != 1)
        if (atomic_compare_exchange_weak_explicit(&tk->calls, &calls, calls - 1,
                                                  memory_order_release, memory_order_relaxed))
            return;
    /* Closed, and this is the last call: destroy waits for it. It reads the
     * count under idle_lock, so it cannot see zero and go on to destroy the
     * lock before we are done with it. */
    pthread_mutex_lock(&tk->idle_lock);
    atomic_fetch_sub_explicit(&tk->calls, 1, memory_order_release);
    pthread_cond_broadcast(&tk->idle);
    pthread_mutex_unlock(&tk->idle_lock);
}

void weft__runtime_task_ended(weft_runtime *rt)
{
    weft__tasks *tk = weft__tasks_of(rt);
    if (atomic_load(&tk->state) != WEFT__RT_DYING)
        return; /* nobody waits: no shared counter to touch */
    pthread_mutex_lock(&tk->idle_lock);
    pthread_cond_broadcast(&tk->idle);
    pthread_mutex_unlock(&tk->idle_lock);
}

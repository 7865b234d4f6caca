/*
 * lock.h - a tiny spinlock for the runtime's short critical sections.
 *
 * Why not pthread_mutex_t: a task that parks itself on a wait list takes the
 * list's lock on its own fiber and has it released on the worker's context,
 * after its registers are saved. A spinlock built on C11 atomics allows that
 * hand-over and is understood by TSan; a pthread mutex is owned by a thread
 * and, under TSan, by a fiber. Critical sections guarded by it are a few
 * dozen instructions and never wait.
 */
#ifndef WEFT_LOCK_H
#define WEFT_LOCK_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

typedef struct weft__lock {
    atomic_bool held;
} weft__lock;

#define WEFT__LOCK_INIT {false}

static inline void weft__cpu_relax(void)
{
#if defined(__x86_64__)
    __asm__ __volatile__("pause");
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline bool weft__lock_try(weft__lock *l)
{
    return !atomic_load_explicit(&l->held, memory_order_relaxed) &&
           !atomic_exchange_explicit(&l->held, true, memory_order_acquire);
}

static inline void weft__lock_acquire(weft__lock *l)
{
    for (unsigned spins = 0; !weft__lock_try(l); spins++) {
        if (spins < 64)
            weft__cpu_relax();
        else
            sched_yield(); /* the holder was preempted; let it finish */
    }
}

static inline void weft__lock_release(weft__lock *l)
{
    atomic_store_explicit(&l->held, false, memory_order_release);
}

#endif

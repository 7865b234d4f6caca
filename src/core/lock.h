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

#if defined(__SANITIZE_THREAD__)
#define WEFT__TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WEFT__TSAN 1
#endif
#endif

/* A full (sequentially consistent) fence. gcc's ThreadSanitizer refuses
 * atomic_thread_fence; there a sequentially consistent read-modify-write of
 * a shared word orders the same way and is something TSan understands. */
static inline void weft__fence(void)
{
#ifdef WEFT__TSAN
    static atomic_uint word;
    atomic_fetch_add_explicit(&word, 0, memory_order_seq_cst);
#else
    atomic_thread_fence(memory_order_seq_cst);
#endif
}

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

/*
 * deque.h - bounded Chase-Lev work-stealing deque.
 *
 * The owner pushes and pops at the bottom (LIFO: the newest task runs next,
 * its data still in cache); thieves take from the top (FIFO: the oldest,
 * usually the largest piece of work). Memory orders follow Le, Pop, Cohen
 * and Zappa Nardelli, "Correct and Efficient Work-Stealing for Weak Memory
 * Models" (PPoPP 2013), with signed indices so that bottom - 1 below top is
 * an ordinary negative size. Stores that publish use release order rather
 * than a release fence plus a relaxed store, which is equivalent and lets
 * ThreadSanitizer see the hand-over.
 *
 * Bounded: push fails when full and the caller overflows elsewhere.
 */
#ifndef WEFT_DEQUE_H
#define WEFT_DEQUE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/lock.h"

#define WEFT__DEQUE_SIZE 1024 /* a power of two */

typedef struct weft__deque {
    _Alignas(64) atomic_llong top;     /* thieves */
    _Alignas(64) atomic_llong bottom;  /* owner */
    _Atomic(void *) slots[WEFT__DEQUE_SIZE];
} weft__deque;

#define WEFT__STEAL_EMPTY ((void *)0)
#define WEFT__STEAL_LOST ((void *)1) /* a race was lost: the deque may not be empty */

static inline void weft__deque_init(weft__deque *d)
{
    atomic_init(&d->top, 0);
    atomic_init(&d->bottom, 0);
    for (int i = 0; i < WEFT__DEQUE_SIZE; i++)
        atomic_init(&d->slots[i], NULL);
}

/* Owner only. Returns false when full. */
static inline bool weft__deque_push(weft__deque *d, void *item)
{
    long long b = atomic_load_explicit(&d->bottom, memory_order_relaxed);
    long long t = atomic_load_explicit(&d->top, memory_order_acquire);
    if (b - t >= WEFT__DEQUE_SIZE)
        return false;
    atomic_store_explicit(&d->slots[b & (WEFT__DEQUE_SIZE - 1)], item,
                          memory_order_relaxed);
    atomic_store_explicit(&d->bottom, b + 1, memory_order_release);
    return true;
}

/* Owner only. Returns NULL when empty. */
static inline void *weft__deque_pop(weft__deque *d)
{
    long long b = atomic_load_explicit(&d->bottom, memory_order_relaxed) - 1;
    atomic_store_explicit(&d->bottom, b, memory_order_relaxed);
    weft__fence();
    long long t = atomic_load_explicit(&d->top, memory_order_relaxed);
    if (t > b) { /* empty */
        atomic_store_explicit(&d->bottom, b + 1, memory_order_relaxed);
        return NULL;
    }
    void *item = atomic_load_explicit(&d->slots[b & (WEFT__DEQUE_SIZE - 1)],
                                      memory_order_relaxed);
    if (t == b) { /* the last item: race the thieves for it */
        if (!atomic_compare_exchange_strong_explicit(
                &d->top, &t, t + 1, memory_order_seq_cst, memory_order_relaxed))
            item = NULL;
        atomic_store_explicit(&d->bottom, b + 1, memory_order_relaxed);
    }
    return item;
}

/* Any thread. Returns an item, WEFT__STEAL_EMPTY or WEFT__STEAL_LOST. */
static inline void *weft__deque_steal(weft__deque *d)
{
    long long t = atomic_load_explicit(&d->top, memory_order_acquire);
    weft__fence();
    long long b = atomic_load_explicit(&d->bottom, memory_order_acquire);
    if (t >= b)
        return WEFT__STEAL_EMPTY;
    void *item = atomic_load_explicit(&d->slots[t & (WEFT__DEQUE_SIZE - 1)],
                                      memory_order_relaxed);
    if (!atomic_compare_exchange_strong_explicit(
            &d->top, &t, t + 1, memory_order_seq_cst, memory_order_relaxed))
        return WEFT__STEAL_LOST;
    return item;
}

/* Any thread; a hint, exact only for the owner. */
static inline long long weft__deque_size(weft__deque *d)
{
    long long b = atomic_load_explicit(&d->bottom, memory_order_relaxed);
    long long t = atomic_load_explicit(&d->top, memory_order_relaxed);
    return b > t ? b - t : 0;
}

#endif

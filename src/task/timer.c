/*
 * timer.c - a deadline heap served by one thread.
 *
 * Entries (weft__timer) live on the waiters' stacks: sleepers, and the
 * deadlines of timed waits. The heap holds pointers to them and each entry
 * knows its heap index, so a cancelled sleeper, or a timed wait that ended
 * some other way, removes itself in O(log n). The heap and every entry in
 * it are guarded by `lock`, and an entry is fired only under it, so once
 * weft__timers_remove returns the entry is the waiter's again. A timed
 * wait's entry fires the same parker as the waiter linked on the object:
 * one more firer racing for the parker's CAS (task/wait.h).
 *
 * The thread sleeps on `wakeup` (a futex word bumped whenever the earliest
 * deadline moves earlier, or on shutdown).
 *
 * This file also gives the public clock of deadlines: weft_now_ns.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "core/clock.h"
#include "core/futex.h"
#include "core/lock.h"
#include "task/timer.h"
#include "task/wait.h"
#include "weft.h"

#define NOT_QUEUED ((size_t)-1)

typedef weft__timer sleep_entry;

struct weft__timers {
    weft__lock lock;
    sleep_entry **heap;
    size_t len, cap;
    atomic_uint wakeup;
    atomic_bool stopping;
    pthread_t thread;
};

/* ---- the heap (lock held) --------------------------------------------- */

static void heap_set(weft__timers *tm, size_t i, sleep_entry *e)
{
    tm->heap[i] = e;
    e->index = i;
}

static void sift_up(weft__timers *tm, size_t i)
{
    sleep_entry *e = tm->heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (tm->heap[parent]->deadline <= e->deadline)
            break;
        heap_set(tm, i, tm->heap[parent]);
        i = parent;
    }
    heap_set(tm, i, e);
}

static void sift_down(weft__timers *tm, size_t i)
{
    sleep_entry *e = tm->heap[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= tm->len)
            break;
        if (child + 1 < tm->len && tm->heap[child + 1]->deadline < tm->heap[child]->deadline)
            child++;
        if (e->deadline <= tm->heap[child]->deadline)
            break;
        heap_set(tm, i, tm->heap[child]);
        i = child;
    }
    heap_set(tm, i, e);
}

static int heap_push(weft__timers *tm, sleep_entry *e)
{
    if (tm->len == tm->cap) {
        size_t cap = tm->cap ? 2 * tm->cap : 64;
        sleep_entry **heap = realloc(tm->heap, cap * sizeof *heap);
        if (!heap)
            return WEFT_ENOMEM;
        tm->heap = heap;
        tm->cap = cap;
    }
    heap_set(tm, tm->len++, e);
    sift_up(tm, e->index);
    return WEFT_OK;
}

static void heap_remove(weft__timers *tm, sleep_entry *e)
{
    size_t i = e->index;
    sleep_entry *last = tm->heap[--tm->len];
    e->index = NOT_QUEUED;
    if (last == e)
        return;
    heap_set(tm, i, last);
    sift_up(tm, i);
    sift_down(tm, last->index);
}

/* ---- the timer thread -------------------------------------------------- */

static void *timer_main(void *arg)
{
    weft__timers *tm = arg;
    while (!atomic_load(&tm->stopping)) {
        unsigned seen = atomic_load(&tm->wakeup);
        uint64_t now = weft__now_ns(), next = 0;
        weft__lock_acquire(&tm->lock);
        while (tm->len > 0 && tm->heap[0]->deadline <= now) {
            sleep_entry *e = tm->heap[0];
            heap_remove(tm, e);
            weft__waiter_fire(&e->waiter, e->status); /* a refusal: it is leaving anyway */
        }
        if (tm->len > 0)
            next = tm->heap[0]->deadline;
        weft__lock_release(&tm->lock);

        if (next) {
            uint64_t wait = next - now;
            struct timespec ts = {(time_t)(wait / 1000000000u), (long)(wait % 1000000000u)};
            weft__futex_wait(&tm->wakeup, seen, &ts);
        } else {
            weft__futex_wait(&tm->wakeup, seen, NULL);
        }
    }
    return NULL;
}

static void poke(weft__timers *tm)
{
    atomic_fetch_add(&tm->wakeup, 1);
    weft__futex_wake(&tm->wakeup, 1);
}

int weft__timers_create(weft__timers **out)
{
    weft__timers *tm = calloc(1, sizeof *tm);
    if (!tm)
        return WEFT_ENOMEM;
    if (pthread_create(&tm->thread, NULL, timer_main, tm)) {
        free(tm);
        return WEFT_ESYS;
    }
    pthread_setname_np(tm->thread, "weft-timer");
    *out = tm;
    return WEFT_OK;
}

void weft__timers_destroy(weft__timers *tm)
{
    atomic_store(&tm->stopping, true);
    poke(tm);
    pthread_join(tm->thread, NULL);
    free(tm->heap);
    free(tm);
}

int weft__timers_add(weft__timers *tm, weft__timer *t)
{
    weft__lock_acquire(&tm->lock);
    int rc = heap_push(tm, t);
    if (rc == WEFT_OK && t->index == 0)
        poke(tm); /* the earliest deadline moved: the thread must re-arm */
    if (rc != WEFT_OK)
        t->index = NOT_QUEUED;
    weft__lock_release(&tm->lock);
    return rc;
}

void weft__timers_remove(weft__timers *tm, weft__timer *t)
{
    weft__lock_acquire(&tm->lock);
    if (t->index != NOT_QUEUED)
        heap_remove(tm, t);
    weft__lock_release(&tm->lock);
}

int weft__timers_sleep(weft__timers *tm, uint64_t ns)
{
    /* Saturated: a deadline past the clock's range is never reached, and
     * such a sleep ends only by cancellation. */
    uint64_t deadline = weft_deadline_in_ns(ns);
    sleep_entry e = {.deadline = deadline, .index = NOT_QUEUED, .status = WEFT_OK};
    weft__waiter_init(&e.waiter, WEFT__WAITS_SLEEP);

    weft__lock_acquire(&tm->lock);
    int rc = heap_push(tm, &e);
    if (rc != WEFT_OK) {
        weft__lock_release(&tm->lock);
        return rc;
    }
    if (e.index == 0)
        poke(tm); /* the earliest deadline moved: the thread must re-arm */
    rc = weft__waiter_wait(&e.waiter, &tm->lock, true);
    if (rc == WEFT_ECANCELED) {
        weft__lock_acquire(&tm->lock);
        if (e.index != NOT_QUEUED)
            heap_remove(tm, &e);
        weft__lock_release(&tm->lock);
    }
    return rc;
}

uint64_t weft_now_ns(void)
{
    return weft__now_ns();
}

uint64_t weft_deadline_in_ns(uint64_t ns)
{
    uint64_t now = weft__now_ns();
    return ns >= WEFT_FOREVER - now ? WEFT_FOREVER : now + ns;
}

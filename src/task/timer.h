/*
 * timer.h - sleeping tasks without blocking workers.
 *
 * One timer thread per runtime keeps a min-heap of deadlines and fires each
 * sleeper's waiter when its deadline passes. With no timer pending it sleeps
 * without a timeout, so an idle runtime uses no CPU.
 */
#ifndef WEFT_TIMER_H
#define WEFT_TIMER_H

#include <stddef.h>
#include <stdint.h>

#include "task/wait.h"

typedef struct weft__timers weft__timers;

/* A deadline that fires a waiter: it lives on the waiting task's stack and
 * is in the heap from weft__timers_add until it fires or is removed. */
typedef struct weft__timer {
    uint64_t deadline;   /* CLOCK_MONOTONIC nanoseconds */
    size_t index;        /* position in the heap; for timer.c */
    int status;          /* what the waiter is fired with */
    weft__waiter waiter; /* bound to the parker to fire */
} weft__timer;

int weft__timers_create(weft__timers **timers);
void weft__timers_destroy(weft__timers *timers); /* no sleeper may remain */

/* Suspend the calling task (or block the thread) for at least ns. Returns
 * WEFT_OK, or WEFT_ECANCELED if the task was cancelled meanwhile. */
int weft__timers_sleep(weft__timers *timers, uint64_t ns);

/* Fire t->waiter with t->status once t->deadline has passed (the caller
 * sets those three). Returns WEFT_OK or WEFT_ENOMEM (not added). Lock
 * order: a list's lock may be held, never taken while the timers' is. */
int weft__timers_add(weft__timers *timers, weft__timer *t);

/* Take t out if it has not fired yet. After this returns the timer thread
 * no longer touches t, so it may go out of scope. */
void weft__timers_remove(weft__timers *timers, weft__timer *t);

#endif

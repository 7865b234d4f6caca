/*
 * timer.h - sleeping tasks without blocking workers.
 *
 * One timer thread per runtime keeps a min-heap of deadlines and fires each
 * sleeper's waiter when its deadline passes. With no timer pending it sleeps
 * without a timeout, so an idle runtime uses no CPU.
 */
#ifndef WEFT_TIMER_H
#define WEFT_TIMER_H

#include <stdint.h>

typedef struct weft__timers weft__timers;

int weft__timers_create(weft__timers **timers);
void weft__timers_destroy(weft__timers *timers); /* no sleeper may remain */

/* Suspend the calling task (or block the thread) for at least ns. Returns
 * WEFT_OK, or WEFT_ECANCELED if the task was cancelled meanwhile. */
int weft__timers_sleep(weft__timers *timers, uint64_t ns);

#endif

/*
 * sched.h - worker threads and the queues that feed them.
 *
 * One worker thread per core by default. Each worker owns a bounded
 * Chase-Lev deque (it pushes and pops at the bottom, thieves take from the
 * top) and a LIFO slot holding the task it woke last, which runs next while
 * its data is still in cache. Tasks spawned or woken from outside any worker
 * go to the shared injection queue, which workers also check every few ticks
 * so it never starves. High-priority tasks have a shared queue that every
 * worker checks first; low-priority ones a shared queue checked when nothing
 * else is ready and, every few ticks, before everything else.
 *
 * Idle workers search (spin over the queues) briefly and then park on an
 * event count. New work wakes a parked worker only when none is searching;
 * a searcher that finds work wakes the next one. An idle runtime has every
 * worker parked and uses no CPU.
 */
#ifndef WEFT_SCHED_H
#define WEFT_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "fiber/fiber.h"
#include "task/task.h"

typedef struct weft__sched weft__sched;
typedef struct weft__worker weft__worker;

/* Start nworkers threads running tasks whose stacks come from stacks. */
int weft__sched_create(weft__sched **s, unsigned nworkers, weft__stack_pool *stacks);

/* Stop and join every worker. No task may be queued or running. */
void weft__sched_destroy(weft__sched *s);

unsigned weft__sched_workers(const weft__sched *s);

/* Poll sources: completions nobody else notices, each from a fixed slot.
 * The devices' completion engines are one source; messages (a
 * message-passing library's requests, registered by that library's own
 * layer) another. The scheduler knows them only as these callbacks. */
enum {
    WEFT__POLL_DEVICES,  /* the runtime's devices */
    WEFT__POLL_MESSAGES, /* requests of a message-passing library */
    WEFT__POLL_SOURCES
};

/* A source registers a poller: idle workers call poll (it fires what
 * completed, returning how many waits it ended), and while any source's
 * pending() says work is outstanding, one parked worker (the watcher) wakes
 * up on a growing timeout to poll again instead of sleeping for good. Set
 * once per source, before any task waits on it; polling costs nothing for a
 * source not set. */
void weft__sched_set_poller(weft__sched *s, unsigned source, unsigned (*poll)(void *ctx),
                            bool (*pending)(void *ctx), void *ctx);

/* Has source a poller? */
bool weft__sched_polls(weft__sched *s, unsigned source);

/* For the count of stalled time (weft_stats.stalled_ns): busy_ns gives the
 * devices' busy time so far. A worker's sleep with tasks alive at both its
 * ends is a stall for as long as it lasted less the busy time that grew
 * meanwhile: the worker had nothing to run and the devices nothing to do.
 * Set once, before any task runs. */
void weft__sched_set_idle_probe(weft__sched *s, uint64_t (*busy_ns)(void *ctx), void *ctx);

/* Stop polling source (or probing); returns once no worker is inside a
 * poll, a pending or the probe. */
void weft__sched_clear_poller(weft__sched *s, unsigned source);
void weft__sched_clear_idle_probe(weft__sched *s);

/* Get a worker polling: a wait on a poll source started and every worker
 * may be asleep. Cheap when a worker is searching or watching already. */
void weft__sched_kick(weft__sched *s);

/* Queue a new task: on the calling worker's deque if it belongs to s, else
 * on the injection queue. */
void weft__sched_spawn(weft__sched *s, weft__task *t);

/* Make a suspended task ready again: into the calling worker's LIFO slot if
 * it belongs to s, else the injection queue. */
void weft__sched_wake(weft__sched *s, weft__task *t);

/* ---- used by the task layer from inside a task ------------------------- */

/* The worker the calling thread is, or NULL. Never inlined. */
weft__worker *weft__worker_self(void);

/* The task w is running (NULL on its own context) and w's scheduler. */
weft__task *weft__worker_current(weft__worker *w);
weft__sched *weft__worker_sched(weft__worker *w);

/* Counters a worker keeps of its own work; only that worker writes them
 * (relaxed load and store: no locked instruction on the hot path). */
typedef struct weft__worker_stats {
    atomic_uint_least64_t spawned, finished, switches, steals, parks, awaits, await_ns;
    atomic_uint_least64_t stalled_ns; /* asleep with tasks alive and the devices idle */
} weft__worker_stats;

/* Release order: weft__sched_live reads finishes before spawns, and a
 * finish it sees must bring the spawn before it into view. */
static inline void weft__count(atomic_uint_least64_t *c, uint64_t n)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_release);
}

weft__worker_stats *weft__worker_stats_of(weft__worker *w);

/* Sum every worker's counters (and those of spawns from outside) into out. */
void weft__sched_stats(weft__sched *s, weft_stats *out);

/* Tasks spawned and not finished, read from the counters without a shared
 * hot counter. Never 0 while a task is alive: it reads every worker's
 * finishes first, then the spawns, and a task's spawn is counted before
 * the task can run. It may be above the truth for a moment (a retry then
 * sees less). */
int64_t weft__sched_live(weft__sched *s);

/* Per-worker caches the task layer keeps (stacks, task records). */
weft__stack_cache *weft__worker_stacks(weft__worker *w);
weft__task_cache *weft__worker_tasks(weft__worker *w);

/* Ways a task leaves the CPU, executed by the worker once the task's
 * registers are saved. */
typedef enum weft__leave {
    WEFT__LEAVE_PARK,  /* its parker is armed: move it to WAITING */
    WEFT__LEAVE_YIELD, /* ready again: behind the other ready tasks */
    WEFT__LEAVE_EXIT   /* finished: weft__task_finish */
} weft__leave;

/* Switch from the calling task t back to its worker, which then does how.
 * Returns when t runs again (LEAVE_EXIT never returns). */
void weft__sched_leave(weft__task *t, weft__leave how);

#endif

/*
 * task.h - the task record and the parker every wait is built on.
 *
 * A task is a record (this struct, pooled per runtime) plus a fiber whose
 * stack is taken when the task first runs and given back when it ends, so a
 * finished but unjoined task holds no stack.
 *
 * The parker is the one word through which a wait ends. Its phase moves
 *   RUNNING -> ARMED -> WAITING -> NOTIFIED -> RUNNING
 * ARMED: the waiter is linked somewhere but the task still runs; WAITING:
 * its registers are saved and it may be scheduled; NOTIFIED carries the
 * status the wait ends with. Firers and cancel race with one CAS each; the
 * winner's status is the one the waiter sees, and only a firer that moves
 * WAITING -> NOTIFIED schedules the task (or wakes the thread).
 */
#ifndef WEFT_TASK_H
#define WEFT_TASK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "core/lock.h"
#include "fiber/fiber.h"
#include "task/wait.h"
#include "trace/trace.h"
#include "weft.h"

struct weft__worker;
struct weft__stream;
struct weft__device;

enum {
    WEFT__PARK_RUNNING = 0,
    WEFT__PARK_ARMED = 1,
    WEFT__PARK_WAITING = 2,
    WEFT__PARK_NOTIFIED = 3,
    WEFT__PARK_PHASE = 3,        /* mask of the phase bits */
    WEFT__PARK_CANCELLABLE = 4,  /* set while armed for a cancellable wait */
    WEFT__PARK_STATUS_SHIFT = 8  /* NOTIFIED: -status in the bits above */
};

typedef struct weft__parker {
    atomic_uint state;        /* also the futex word of a thread parker */
    struct weft__task *task;  /* NULL: the parker of a plain thread */
    uint8_t waits_on;         /* a weft__waits_on, for the timeline */
} weft__parker;

typedef struct weft__task {
    struct weft__task *next;  /* queue link (injection, priority queues) */
    weft__parker parker;
    struct weft__worker *worker; /* the worker that last ran it */
    weft_runtime *rt;
    void *(*fn)(void *);
    void *arg;
    void *result;
    weft__fiber fiber;
    weft__stack *stack;       /* NULL until the task first runs */
    size_t stack_size;        /* 0: the runtime's default */
    const char *name;
    uint8_t priority;         /* weft_priority */
    bool started;
    atomic_bool cancelled;
    atomic_bool done;
    weft__lock lock;          /* guards joiners, detached and done's setting */
    weft__waitq joiners;
    bool detached;
    atomic_bool join_claimed; /* a join or detach holds the handle */
    atomic_ushort generation; /* matches the live handle's tag */
    int status;               /* the task's own outcome, read by join */
    unsigned device;          /* placement asked for: 0 any, i + 1 device i */
    struct weft__stream *stream; /* leased on first device work */
    struct weft__device *stream_device; /* the device stream belongs to */
    int device_status;        /* first device failure, kept for join */
    struct weft__await_check_node *checks; /* run at its next drain (device/await_check.h) */
    bool region_open;         /* between weft_region_begin and _end */
    struct weft__stream *region_stream; /* records the region's work, or NULL */
    bool region_broken;       /* it tried to suspend: the region is dropped */
    uint64_t region_key;
    weft__errbuf errmsg;    /* its last error (core/error.h) */
    weft__trace_task trace; /* the timeline's record (trace_hooks.c) */
} weft__task;

/* Task records a worker keeps for reuse without locking. */
typedef struct weft__task_cache {
    weft__task *head;
    unsigned count;
} weft__task_cache;

/* ---- for the scheduler ------------------------------------------------- */

/* The task the calling thread is running, or NULL. Never inlined: tasks move
 * between threads, so the thread-local must be re-read after any switch. */
weft__task *weft__task_self(void);

/* Give t its stack and fiber before its first run. Returns false if t was
 * cancelled before it started (it has then been finished) or no stack could
 * be had (t then ends with WEFT_ENOMEM). */
bool weft__task_start(struct weft__worker *w, weft__task *t);

/* t has returned from its function and switched away for good. */
void weft__task_finish(struct weft__worker *w, weft__task *t);

/* The running task's last-error buffer, or NULL outside tasks: the lookup
 * the composition root registers with core (weft__error_set_lookup). */
weft__errbuf *weft__task_errbuf(void);

/* Every public call that may suspend the calling task asks first: inside a
 * graph region it may not (the capture belongs to this thread), so the
 * call fails with WEFT_ESTATE and the region is dropped. */
int weft__task_may_suspend(const char *fn);

/* ---- what tasks report to the timeline (trace_hooks.c) ----------------- */
/* Behind weft__trace_on(): the callers test it (one branch) and call in. */

/* A worker is about to switch into t: reports the wait t comes back from;
 * returns the time, to pass to weft__trace_leave. */
uint64_t weft__trace_resume(weft__task *t);
/* t switched back to its worker after running since start; parked: it
 * is suspended in a wait (not yielding, not finished). */
void weft__trace_leave(weft__task *t, uint64_t start, bool parked);
/* t's wait was just ended (by a firer or by cancellation). */
void weft__trace_woken(weft__task *t);

/* ---- parking: the primitive under weft__waiter_wait ---------------------- */

/* The calling task's or thread's parker. */
weft__parker *weft__parker_self(void);

/* Arm p (RUNNING -> ARMED) for a wait that may be fired from now on;
 * waits_on (a weft__waits_on) says for what. */
void weft__parker_arm(weft__parker *p, bool cancellable, unsigned waits_on);

/* Release lock (if not NULL), then suspend the task (or block the thread)
 * until the armed parker is notified, and return the status it was notified
 * with. A cancellable wait of a cancelled task returns WEFT_ECANCELED. */
int weft__parker_park(weft__parker *p, weft__lock *lock);

/* weft__parker_park that also ends at deadline (WEFT_FOREVER: never) with
 * WEFT_ETIMEDOUT; see weft__waiter_wait_until. */
int weft__parker_park_until(weft__parker *p, weft__lock *lock, uint64_t deadline);

/* Try to end p's wait with status. cancel: only if the wait is cancellable.
 * Returns true if this call ended it. */
bool weft__parker_notify(weft__parker *p, int status, bool cancel);

#endif

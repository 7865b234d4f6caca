/*
 * tasks.h - the task layer's share of a runtime record.
 *
 * A weft_runtime (runtime.h, the composition root) begins with this
 * record, so the task layer reaches its share from a weft_runtime * by a
 * cast that costs nothing (weft__tasks_of); runtime.c asserts the layout.
 * The layers above reach the task layer this way too; the task layer never
 * sees the rest of the runtime record. What the task layer needs from above
 * (the device table for placement, draining a task's device work at exit)
 * it gets through hooks the composition root sets at creation.
 *
 * Calls racing destroy. Every public call on a runtime enters it
 * (weft__runtime_enter) and leaves it when done. A call from a thread that is
 * not one of rt's tasks is counted in `calls`, and only while the OPEN bit is
 * set; destroy clears the bit, then waits until the count and the live tasks
 * are both zero. So a call either ran to its end before destroy went on, or
 * was refused with WEFT_ESTATE. A call from one of rt's own tasks is not
 * counted (destroy waits for the task anyway), which keeps spawns and joins
 * from tasks free of a shared atomic.
 */
#ifndef WEFT_TASKS_H
#define WEFT_TASKS_H

#include <pthread.h>
#include <stdatomic.h>

#include "fiber/fiber.h"
#include "task/blocking.h"
#include "task/sched.h"
#include "task/task.h"
#include "task/timer.h"
#include "trace/trace.h"
#include "weft.h"

/* The stack sizes weft_config and weft_task_opts accept (0: the default). */
#define WEFT__STACK_MIN ((size_t)16 * 1024)
#define WEFT__STACK_MAX ((size_t)1 << 30)

enum { WEFT__RT_DEAD = 0, WEFT__RT_LIVE = 0x77656674, WEFT__RT_DYING = 0x64796e67 };

#define WEFT__RT_OPEN (1u << 31) /* in calls: the runtime takes calls */

struct weft__device;

typedef struct weft__tasks {
    /* Kept from one life of the record to the next: */
    atomic_uint state;
    atomic_uint calls;      /* WEFT__RT_OPEN | calls in progress from outside */
    weft__task *free_tasks; /* task records not cached by a worker */
    void *task_chunks;      /* every task record this record ever had */

    /* Set up anew by each weft_runtime_create, from here on: */
    weft__sched *sched;
    weft__timers *timers;
    weft__blocking blocking; /* threads for weft_blocking, started on demand */
    weft__stack_pool *stacks;
    weft__trace *trace; /* the timeline; recording or not */
    size_t stack_size;  /* a task's stack unless it asks for another */

    pthread_mutex_t idle_lock;
    pthread_cond_t idle; /* while dying: a task ended */

    pthread_mutex_t pool_lock; /* guards free_tasks and task_chunks */

    /* Hooks the composition root sets before the runtime takes calls: */
    /* rt's devices (at least one), created on first use. */
    int (*devices)(weft_runtime *rt, struct weft__device ***devs, unsigned *n);
    /* Device work left unawaited when t returns (t->stream is set). */
    void (*task_exit)(weft__task *t);
} weft__tasks;

static inline weft__tasks *weft__tasks_of(weft_runtime *rt)
{
    return (weft__tasks *)(void *)rt;
}

static inline weft__sched *weft__runtime_sched(weft_runtime *rt)
{
    return weft__tasks_of(rt)->sched;
}

static inline int weft__runtime_devices(weft_runtime *rt, struct weft__device ***devs, unsigned *n)
{
    return weft__tasks_of(rt)->devices(rt, devs, n);
}

/* Enter a call on rt; fn names the caller in the error message. WEFT_OK:
 * rt stays alive until the weft__runtime_leave that must follow (from the
 * same task or thread). Otherwise WEFT_EINVAL (rt NULL) or WEFT_ESTATE (rt
 * is being or was destroyed), and no leave. From one of rt's own tasks a
 * dying runtime still takes calls (its tasks are finishing). */
int weft__runtime_enter(weft_runtime *rt, const char *fn);
void weft__runtime_leave(weft_runtime *rt);

/* A task of rt ended: while rt is being destroyed, the destroyer looks. */
void weft__runtime_task_ended(weft_runtime *rt);

/* Task records (task.c). Retiring, once rt has no task left, makes every
 * handle of rt's tasks stale and frees every record for rt's next life. */
weft__task *weft__task_alloc(weft_runtime *rt);
void weft__task_pool_retire(weft_runtime *rt);
/* Tasks of rt that ended with their handle neither joined nor detached.
 * Call once no task is running. */
uint64_t weft__task_unjoined(weft_runtime *rt);

#endif

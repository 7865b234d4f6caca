/*
 * runtime.h - the runtime record that ties the layers together.
 *
 * A runtime owns a scheduler (workers), a timer thread, a stack pool, a pool
 * of task records and, created on first use, its device and the threads of
 * weft_blocking. Runtime records are
 * never returned to malloc: a destroyed one is marked dead and kept for the
 * next weft_runtime_create, so that calls on a destroyed runtime fail with
 * WEFT_ESTATE instead of touching freed memory. A record keeps its task
 * records too, so a stale task handle's generation is read from memory that
 * is still a task record.
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
#ifndef WEFT_RUNTIME_H
#define WEFT_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>

#include "device/device.h"
#include "fiber/fiber.h"
#include "sched/sched.h"
#include "sched/timer.h"
#include "task/blocking.h"
#include "task/task.h"
#include "trace/trace.h"
#include "weft.h"

/* The stack sizes weft_config and weft_task_opts accept (0: the default). */
#define WEFT__STACK_MIN ((size_t)16 * 1024)
#define WEFT__STACK_MAX ((size_t)1 << 30)

enum { WEFT__RT_DEAD = 0, WEFT__RT_LIVE = 0x77656674, WEFT__RT_DYING = 0x64796e67 };

#define WEFT__RT_OPEN (1u << 31) /* in calls: the runtime takes calls */

struct weft_runtime {
    /* Kept from one life of the record to the next: */
    atomic_uint state;
    atomic_uint calls;      /* WEFT__RT_OPEN | calls in progress from outside */
    weft__task *free_tasks; /* task records not cached by a worker */
    void *task_chunks;      /* every task record this record ever had */
    weft_runtime *next_dead;

    /* Set up anew by each weft_runtime_create, from here on: */
    weft_config cfg;          /* with defaults filled in */
    weft__sched *sched;
    weft__timers *timers;
    weft__blocking blocking; /* threads for weft_blocking, started on demand */
    weft__stack_pool *stacks;
    weft__trace *trace;        /* the timeline; recording or not */
    uint64_t created_ns;       /* for weft_stats.elapsed_ns */

    pthread_mutex_t idle_lock;
    pthread_cond_t idle;      /* while dying: a task ended */

    pthread_mutex_t pool_lock; /* guards free_tasks and task_chunks */

    pthread_mutex_t device_lock; /* guards creating the device table */
    atomic_bool devices_ready;
    weft__device **devices;
    unsigned ndevices;
};

static inline weft__sched *weft__runtime_sched(weft_runtime *rt)
{
    return rt->sched;
}

/* Enter a call on rt; fn names the caller in the error message. WEFT_OK:
 * rt stays alive until the weft__runtime_leave that must follow (from the
 * same task or thread). Otherwise WEFT_EINVAL (rt NULL) or WEFT_ESTATE (rt
 * is being or was destroyed), and no leave. From one of rt's own tasks a
 * dying runtime still takes calls (its tasks are finishing). */
int weft__runtime_enter(weft_runtime *rt, const char *fn);
void weft__runtime_leave(weft_runtime *rt);

/* rt's devices (at least one), created on first use. */
int weft__runtime_devices(weft_runtime *rt, weft__device ***devs, unsigned *n);

/* A task of rt ended: while rt is being destroyed, the destroyer looks. */
void weft__runtime_task_ended(weft_runtime *rt);

/* Task records (task.c). Retiring, once rt has no task left, makes every
 * handle of rt's tasks stale and frees every record for rt's next life. */
weft__task *weft__task_alloc(weft_runtime *rt);
void weft__task_pool_retire(weft_runtime *rt);
/* Tasks of rt that ended with their handle neither joined nor detached.
 * Call once no task is running. */
uint64_t weft__task_unjoined(weft_runtime *rt);

/* Device work left unawaited when a task returns (device/api.c). */
void weft__device_task_exit(weft__task *t);

/* The calling task and the stream its device work goes to now, leasing one
 * if needed (device/api.c). */
int weft__task_stream(const char *fn, weft__task **tp, struct weft__stream **sp);

/* Stop a task's open region and drop its work (device/region.c). */
void weft__region_drop(weft__task *t);

/* weft_stats_get without the check of rt's state: the destroyer reads a
 * dying runtime's counters (runtime.c). */
void weft__stats_read(weft_runtime *rt, weft_stats *stats);

/* The diagnosis (report.c): the fields of weft_stats that the devices'
 * counters and the clock give; the scheduler's probe of the devices' busy
 * time; the report of
 * WEFT_REPORT, made by weft_runtime_destroy once no task is left. */
void weft__stats_devices(weft_runtime *rt, weft_stats *stats);
uint64_t weft__runtime_busy_ns(void *rt);
void weft__report_at_destroy(weft_runtime *rt);

#endif

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
 * The record begins with the task layer's share (task/tasks.h: the
 * scheduler, timers, stacks, the task pool and the gate every public call
 * passes); the rest (configuration, the device table) is the composition
 * root's.
 */
#ifndef WEFT_RUNTIME_H
#define WEFT_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>

#include "device/device.h"
#include "task/tasks.h"
#include "weft.h"

struct weft_runtime {
    weft__tasks tasks; /* first: see task/tasks.h */

    /* Kept from one life of the record to the next: */
    weft_runtime *next_dead;

    /* Set up anew by each weft_runtime_create, from here on: */
    weft_config cfg;     /* with defaults filled in */
    uint64_t created_ns; /* for weft_stats.elapsed_ns */

    pthread_mutex_t device_lock; /* guards creating the device table */
    atomic_bool devices_ready;
    weft__device **devices;
    unsigned ndevices;
};

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

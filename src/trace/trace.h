/*
 * trace.h - the timeline: what the runtime's threads, tasks and devices did,
 * written as Chrome trace event JSON (it opens in Perfetto).
 *
 * A runtime owns one weft__trace for its whole life; a recording session
 * (weft_trace_start .. weft_trace_stop, or WEFT_TRACE=FILE for the runtime's
 * life) writes one file. Every thread that records keeps a buffer of its own:
 * appending an event takes no lock and touches no shared cache line. Full
 * chunks of events go to a writer thread, which turns them into JSON in the
 * background; stopping writes the rest, names the tracks and closes the
 * array, so that a file is valid JSON however the tasks ended.
 *
 * Cost while no runtime records: weft__trace_on() is one load of a global
 * and one branch, and the hooks sit behind it.
 *
 * What is recorded (ts and dur in nanoseconds of weft__now_ns):
 *  - RUN: a task ran on a thread from ts for dur (a complete event on the
 *    worker's track, named by the task);
 *  - WAIT: a task waited for `what` (join, mutex, GPU, ...) from ts for dur,
 *    then sat ready for `ready` ns before a worker took it (async events, one
 *    track per task);
 *  - OP: a device operation ran on stream `stream` of device `device` (a
 *    complete event on that stream's track).
 */
#ifndef WEFT_TRACE_H
#define WEFT_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct weft__trace weft__trace;

/* What a suspended task waits for: given by the code that parks it. */
typedef enum weft__waits_on {
    WEFT__WAITS_OTHER = 0,
    WEFT__WAITS_JOIN, /* weft_join, weft_when_all */
    WEFT__WAITS_ANY,  /* weft_when_any */
    WEFT__WAITS_MUTEX,
    WEFT__WAITS_COND,
    WEFT__WAITS_SEM,
    WEFT__WAITS_SEND, /* weft_chan_send */
    WEFT__WAITS_RECV, /* weft_chan_recv */
    WEFT__WAITS_SLEEP,
    WEFT__WAITS_GPU,         /* weft_await, weft_event_await on a GPU */
    WEFT__WAITS_HOST_DEVICE, /* ... on the host backend */
    WEFT__WAITS_BLOCKING,    /* weft_blocking */
    WEFT__WAITS_COUNT
} weft__waits_on;

/* Kinds of device operation. */
typedef enum weft__op_kind {
    WEFT__OP_COPY,
    WEFT__OP_FILL,
    WEFT__OP_HOST_FN,
    WEFT__OP_KERNEL,
    WEFT__OP_GRAPH,
    WEFT__OP_COUNT
} weft__op_kind;

enum { WEFT__TRACE_NAME = 40 }; /* bytes of a name kept per event */

/* src, cut to fit a WEFT__TRACE_NAME buffer. */
static inline void weft__trace_copy_name(char *dst, const char *src)
{
    size_t n = strnlen(src, WEFT__TRACE_NAME - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- the one branch ------------------------------------------------------ */

/* Runtimes recording now, in the whole process. */
extern atomic_uint weft__trace_live;

static inline bool weft__trace_on(void)
{
    return __builtin_expect(atomic_load_explicit(&weft__trace_live, memory_order_relaxed) != 0, 0);
}

/* ---- life cycle (runtime.c) ---------------------------------------------- */

int weft__trace_create(weft__trace **tr);
/* Stops a session still open, then frees. No thread may record any more. */
void weft__trace_destroy(weft__trace *tr);

/* Open path and start a session; fn names the caller in error messages. */
int weft__trace_start(weft__trace *tr, const char *path, const char *fn);
/* End the session: write what is left, close the JSON, close the file.
 * WEFT_ESTATE if none was open; WEFT_ESYS if writing failed. */
int weft__trace_stop(weft__trace *tr, const char *fn);

/* For devices that time operations with a profiling library. Of each
 * session of tr, after_start(arg) runs once it has started, before its
 * start returns (the library enabled then, not in the middle of the work
 * it is to time); before_stop(arg) runs as it begins to stop, before
 * anything is closed (the times the library has yet to deliver reported).
 * Either may be NULL. */
void weft__trace_hooks(weft__trace *tr, void (*after_start)(void *), void (*before_stop)(void *),
                       void *arg);

/* Device i is called name ("GPU 0", "host") in the trace. */
void weft__trace_name_device(weft__trace *tr, unsigned device, const char *name);

/* ---- events -------------------------------------------------------------- */

/* A task identity for the timeline, new for each spawn: 0 until the task
 * is first seen while recording, then numbered by the thread that saw it. */
uint64_t weft__trace_task_id(weft__trace *tr, uint64_t *id);

/* A task ran from start to now on the calling thread. */
void weft__trace_run(weft__trace *tr, uint64_t *task_id, const char *task_name, uint64_t start);

/* A task waited for what from start until woken, and was ready from woken
 * until now (when it resumes). */
void weft__trace_wait(weft__trace *tr, uint64_t *task_id, const char *task_name,
                      weft__waits_on what, uint64_t start, uint64_t woken);

/* A device operation ran from start to end on stream `stream` of device
 * `device`; task_id (0: unknown) enqueued it; name NULL: the kind's name. */
void weft__trace_op(weft__trace *tr, unsigned device, unsigned stream, weft__op_kind kind,
                    const char *name, uint64_t bytes, uint64_t task_id, uint64_t start,
                    uint64_t end);

/* Is tr recording now? (After weft__trace_on() said some runtime is.) */
bool weft__trace_recording(const weft__trace *tr);
/* Does tr make NVTX ranges (a profiler is attached)? */
bool weft__trace_nvtx(const weft__trace *tr);

/* What the timeline keeps of one task: the task record embeds it (the task
 * layer sits above this one), and only the task's reports (task/
 * trace_hooks.c) write it, while a trace is on. */
typedef struct weft__trace_task {
    uint64_t id;            /* 0 until first seen by a trace */
    uint64_t parked;        /* when it last parked, 0: it did not */
    _Atomic uint64_t woken; /* when that wait was ended */
    uint64_t nvtx_wait;     /* the NVTX range of that wait */
} weft__trace_task;

const char *weft__waits_on_name(weft__waits_on what);
const char *weft__op_kind_name(weft__op_kind kind);

#endif

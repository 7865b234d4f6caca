/*
 * trace_hooks.c - what the scheduler and the tasks report, turned into trace
 * events and NVTX ranges.
 *
 * The callers test weft__trace_on() (one branch) and call in here; the
 * rest of the checking - is this runtime recording, is a profiler attached
 * - happens here, off the hot path.
 *
 * A task's wait is seen from both ends: the worker notes when the task
 * parked (weft__trace_leave), the firer when the wait ended
 * (weft__trace_woken), and the worker that resumes it reports the wait and
 * the time it then spent ready (weft__trace_resume).
 */
#include "core/clock.h"
#include "trace/nvtx.h"
#include "task/tasks.h"
#include "trace/trace.h"

uint64_t weft__trace_resume(weft__task *t)
{
    weft__trace *tr = weft__tasks_of(t->rt)->trace;
    if (t->trace.parked) {
        if (weft__trace_recording(tr))
            weft__trace_wait(tr, &t->trace.id, t->name, (weft__waits_on)t->parker.waits_on,
                             t->trace.parked,
                             atomic_load_explicit(&t->trace.woken, memory_order_relaxed));
        t->trace.parked = 0;
    }
    if (t->trace.nvtx_wait) {
        weft__nvtx_end(t->trace.nvtx_wait);
        t->trace.nvtx_wait = 0;
    }
    if (weft__trace_nvtx(tr))
        weft__nvtx_push(t->name);
    return weft__now_ns();
}

void weft__trace_leave(weft__task *t, uint64_t start, bool parked)
{
    weft__trace *tr = weft__tasks_of(t->rt)->trace;
    if (weft__trace_recording(tr))
        weft__trace_run(tr, &t->trace.id, t->name, start);
    if (weft__trace_nvtx(tr))
        weft__nvtx_pop();
    if (!parked)
        return;
    t->trace.parked = weft__now_ns();
    atomic_store_explicit(&t->trace.woken, 0, memory_order_relaxed); /* a firer may set it */
    if (weft__trace_nvtx(tr))
        t->trace.nvtx_wait =
            weft__nvtx_start(weft__waits_on_name((weft__waits_on)t->parker.waits_on));
}

void weft__trace_woken(weft__task *t)
{
    atomic_store_explicit(&t->trace.woken, weft__now_ns(), memory_order_relaxed);
}

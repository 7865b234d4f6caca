/*
 * api.c - the public calls that put device work on a task's stream.
 *
 * A task leases a stream on its first device call - on the device its spawn
 * options name, else on the least loaded one - and keeps it until
 * weft_await finds the work complete. A task that returns with work in
 * flight is awaited implicitly, so its stack (which that work may point
 * into) outlives the work. A device failure fails the task: its join
 * returns the failure even if the task ignored it. Events are records of
 * event.c, reached through checked handles.
 */
#include <stdlib.h>
#include <time.h>

#include "core/clock.h"
#include "device/await_check.h"
#include "device/device.h"
#include "device/event.h"
#include "task/tasks.h"
#include "task/task.h"
#include "trace/nvtx.h"

/* The calling task, or the failure to report. */
static int self_task(const char *fn, weft__task **tp)
{
    if (!(*tp = weft__task_self()))
        return weft__fail(WEFT_ENOTASK, "%s: not called from a task", fn);
    return WEFT_OK;
}

static int place(weft__task *t, weft__device **out)
{
    weft__device **devs;
    unsigned n;
    int rc = weft__runtime_devices(t->rt, &devs, &n);
    if (rc)
        return rc;
    if (t->device) {
        if (t->device > n)
            return weft__fail(WEFT_EINVAL, "device: the task asked for device %u of %u",
                              t->device - 1, n);
        *out = devs[t->device - 1];
        return WEFT_OK;
    }
    weft__device *best = devs[0];
    unsigned best_load = best->ops->load(best);
    for (unsigned i = 1; i < n && best_load > 0; i++) {
        unsigned load = devs[i]->ops->load(devs[i]);
        if (load < best_load) {
            best = devs[i];
            best_load = load;
        }
    }
    *out = best;
    return WEFT_OK;
}

/* The calling task and its stream, leasing one if needed. */
int weft__task_stream(const char *fn, weft__task **tp, weft__stream **sp)
{
    weft__task *t = NULL;
    int rc = self_task(fn, &t);
    if (rc)
        return rc;
    if (t->region_stream) { /* inside a region, work is recorded */
        *tp = t;
        *sp = t->region_stream;
        return WEFT_OK;
    }
    if (!t->stream) {
        weft__device *dev = NULL;
        if ((rc = place(t, &dev)) || (rc = dev->ops->stream_lease(dev, t->priority, &t->stream)))
            return rc;
        t->stream_device = dev;
    }
    *tp = t;
    *sp = t->stream;
    return WEFT_OK;
}

/* A device failure at enqueue fails the task too (its join reports it). */
static int noted(weft__task *t, int rc)
{
    if (rc == WEFT_EDEVICE && t->device_status == WEFT_OK)
        t->device_status = rc;
    return rc;
}

static const weft__device_ops *ops_of(const weft__task *t)
{
    return t->stream_device->ops;
}

/* ---- an operation's brackets while a trace is on ------------------------- */

weft__op_bracket weft__op_bracket_open(weft__task *t, weft__stream *s, const char *call,
                                       weft__op_kind kind)
{
    const weft__device_ops *ops = t->stream_device->ops;
    weft__trace *tr = weft__tasks_of(t->rt)->trace;
    weft__op_bracket b = {.timed =
                              ops->trace_begin && !t->region_stream && weft__trace_recording(tr),
                          .nvtx = weft__trace_nvtx(tr)};
    if (b.nvtx)
        weft__nvtx_push(call);
    if (b.timed)
        b.mark = ops->trace_begin(s, kind);
    return b;
}

void weft__op_bracket_close(weft__task *t, weft__stream *s, weft__op_bracket b, weft__op_info op)
{
    if (b.timed) {
        op.task = weft__trace_task_id(weft__tasks_of(t->rt)->trace, &t->trace.id);
        t->stream_device->ops->trace_end(s, b.mark, &op);
    }
    if (b.nvtx)
        weft__nvtx_pop();
}

int weft_memcpy_async(void *dst, const void *src, size_t n)
{
    weft__task *t = NULL;
    weft__stream *s;
    if (n && (!dst || !src))
        return weft__fail(WEFT_EINVAL, "weft_memcpy_async: %s is NULL", dst ? "src" : "dst");
    int rc = weft__task_stream("weft_memcpy_async", &t, &s);
    if (rc || n == 0)
        return rc;
    if (!weft__trace_on())
        return noted(t, ops_of(t)->copy(s, dst, src, n));
    weft__op_bracket b = weft__op_bracket_open(t, s, "weft_memcpy_async", WEFT__OP_COPY);
    rc = ops_of(t)->copy(s, dst, src, n);
    weft__op_bracket_close(t, s, b, (weft__op_info){.kind = WEFT__OP_COPY, .bytes = n});
    return noted(t, rc);
}

int weft_memset_async(void *dst, int value, size_t n)
{
    weft__task *t = NULL;
    weft__stream *s;
    if (n && !dst)
        return weft__fail(WEFT_EINVAL, "weft_memset_async: dst is NULL");
    int rc = weft__task_stream("weft_memset_async", &t, &s);
    if (rc || n == 0)
        return rc;
    if (!weft__trace_on())
        return noted(t, ops_of(t)->fill(s, dst, value, n));
    weft__op_bracket b = weft__op_bracket_open(t, s, "weft_memset_async", WEFT__OP_FILL);
    rc = ops_of(t)->fill(s, dst, value, n);
    weft__op_bracket_close(t, s, b, (weft__op_info){.kind = WEFT__OP_FILL, .bytes = n});
    return noted(t, rc);
}

int weft_host_async(void (*fn)(void *arg), void *arg)
{
    weft__task *t = NULL;
    weft__stream *s;
    if (!fn)
        return weft__fail(WEFT_EINVAL, "weft_host_async: fn is NULL");
    int rc = weft__task_stream("weft_host_async", &t, &s);
    if (rc)
        return rc;
    if (!weft__trace_on())
        return noted(t, ops_of(t)->host_fn(s, fn, arg));
    weft__op_bracket b = weft__op_bracket_open(t, s, "weft_host_async", WEFT__OP_HOST_FN);
    rc = ops_of(t)->host_fn(s, fn, arg);
    weft__op_bracket_close(t, s, b, (weft__op_info){.kind = WEFT__OP_HOST_FN});
    return noted(t, rc);
}

int weft_launch(const void *kernel, weft_dim3 grid, weft_dim3 block, size_t shared_bytes,
                void **args)
{
    weft__task *t = NULL;
    weft__stream *s;
    if (!kernel)
        return weft__fail(WEFT_EINVAL, "weft_launch: kernel is NULL");
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
        return weft__fail(WEFT_EINVAL, "weft_launch: grid %ux%ux%u, block %ux%ux%u has a zero",
                          grid.x, grid.y, grid.z, block.x, block.y, block.z);
    int rc = weft__task_stream("weft_launch", &t, &s);
    if (rc)
        return rc;
    if (!weft__trace_on())
        return noted(t, ops_of(t)->launch(s, kernel, grid, block, shared_bytes, args));
    weft__op_bracket b = weft__op_bracket_open(t, s, "weft_launch", WEFT__OP_KERNEL);
    rc = ops_of(t)->launch(s, kernel, grid, block, shared_bytes, args);
    weft__op_bracket_close(t, s, b, (weft__op_info){.kind = WEFT__OP_KERNEL, .kernel = kernel});
    return noted(t, rc);
}

int weft_stream(void **stream)
{
    weft__task *t = NULL;
    weft__stream *s;
    if (!stream)
        return weft__fail(WEFT_EINVAL, "weft_stream: stream is NULL");
    int rc = weft__task_stream("weft_stream", &t, &s);
    if (rc == WEFT_OK)
        *stream = ops_of(t)->native(s);
    return rc;
}

int weft_task_device(unsigned *device)
{
    weft__task *t = NULL;
    weft__stream *s;
    if (!device)
        return weft__fail(WEFT_EINVAL, "weft_task_device: device is NULL");
    int rc = weft__task_stream("weft_task_device", &t, &s);
    if (rc != WEFT_OK)
        return rc;
    if (!t->stream_device) /* a region's recording stream before any of the task's own */
        return weft__fail(WEFT_ESTATE, "weft_task_device: the task has no device yet");
    *device = WEFT_DEVICE(t->stream_device->index);
    return WEFT_OK;
}

int weft_malloc_async(void **ptr, size_t n)
{
    weft__task *t = NULL;
    weft__stream *s;
    if (!ptr || !n)
        return weft__fail(WEFT_EINVAL, "weft_malloc_async: %s", ptr ? "n is 0" : "ptr is NULL");
    int rc = weft__task_stream("weft_malloc_async", &t, &s);
    return rc ? rc : noted(t, ops_of(t)->malloc_async(s, ptr, n));
}

int weft_free_async(void *ptr)
{
    weft__task *t = NULL;
    weft__stream *s;
    if (!ptr)
        return WEFT_OK;
    int rc = weft__task_stream("weft_free_async", &t, &s);
    return rc ? rc : noted(t, ops_of(t)->free_async(s, ptr));
}

/* ---- waiting ----------------------------------------------------------- */

struct weft__await_check_node {
    struct weft__await_check_node *next;
    int (*check)(void *arg);
    void (*release)(void *arg);
    void *arg;
};

int weft__await_check_add(int (*check)(void *arg), void (*release)(void *arg), void *arg)
{
    weft__task *t = NULL;
    int rc = self_task("weft__await_check_add", &t);
    if (rc == WEFT_OK && !t->stream)
        rc = weft__fail(WEFT_ESTATE, "weft__await_check_add: the task has no device work");
    struct weft__await_check_node *n = rc ? NULL : malloc(sizeof *n);
    if (rc == WEFT_OK && !n)
        rc = weft__fail(WEFT_ENOMEM, "weft__await_check_add: out of memory");
    if (rc) {
        release(arg);
        return rc;
    }
    *n = (struct weft__await_check_node){t->checks, check, release, arg};
    t->checks = n; /* run newest first: the order does not matter */
    return WEFT_OK;
}

/* The drain's checks, once t's stream is idle: the first failure wins. */
static int run_checks(weft__task *t, int rc)
{
    while (t->checks) {
        struct weft__await_check_node *n = t->checks;
        t->checks = n->next;
        if (rc == WEFT_OK)
            rc = n->check(n->arg);
        n->release(n->arg);
        free(n);
    }
    return rc;
}

/* Wait for t's stream to drain and give it back; remember a failure. */
static int drain(weft__task *t)
{
    weft__device *dev = t->stream_device;
    weft__stream *s = t->stream;
    uint64_t start = weft__now_ns();
    int rc = weft__stream_sync(dev->ops, s);
    if (weft__trace_on() && dev->ops->trace_collect)
        dev->ops->trace_collect(s); /* its work is complete: report it */
    weft__worker_stats *st = weft__worker_stats_of(weft__worker_self()); /* maybe another */
    weft__count(&st->awaits, 1);
    weft__count(&st->await_ns, weft__now_ns() - start);
    dev->ops->stream_return(dev, s);
    t->stream = NULL;
    t->stream_device = NULL;
    rc = run_checks(t, rc);
    if (rc && t->device_status == WEFT_OK)
        t->device_status = rc;
    return rc;
}

int weft_await(void)
{
    weft__task *t = NULL;
    int rc = self_task("weft_await", &t);
    if (rc || (rc = weft__task_may_suspend("weft_await")))
        return rc;
    if (t->stream && (rc = drain(t)))
        return rc; /* the backend set the message */
    if (atomic_load(&t->cancelled))
        return weft__fail(WEFT_ECANCELED, "weft_await: the task was cancelled");
    return WEFT_OK;
}

void weft__device_task_exit(weft__task *t)
{
    if (t->region_open) /* returned inside a region: drop it */
        weft__region_drop(t);
    drain(t);
}

/* ---- events ------------------------------------------------------------ */

int weft_event_record(weft_event **out)
{
    weft__task *t = NULL;
    weft__stream *s;
    if (!out)
        return weft__fail(WEFT_EINVAL, "weft_event_record: ev is NULL");
    int rc = weft__task_stream("weft_event_record", &t, &s);
    if (rc)
        return rc;
    if (t->region_open) /* a recorded region has no point in time to mark yet */
        return weft__fail(WEFT_ESTATE, "weft_event_record: not inside a graph region");
    weft__event_point p = {.dev = t->stream_device, .stream = s};
    if ((rc = ops_of(t)->mark(s, &p.seq)))
        return rc;
    return weft__event_new(&p, "weft_event_record", out);
}

int weft_event_await(weft_event *ev)
{
    return weft_event_await_until(ev, WEFT_FOREVER);
}

int weft_event_await_until(weft_event *ev, uint64_t deadline)
{
    weft__event_point p;
    int rc = weft__event_point_of(ev, "weft_event_await", &p);
    if (rc || (rc = weft__task_may_suspend("weft_event_await")))
        return rc;
    rc = p.dev->ops->wait(p.stream, p.seq, deadline);
    return weft__wait_withdrawn(rc) ? weft__wait_fail(rc, "weft_event_await_until") : rc;
}

int weft_stream_wait(weft_event *ev)
{
    weft__task *t = NULL;
    weft__stream *s;
    weft__event_point p;
    int rc = weft__event_point_of(ev, "weft_stream_wait", &p);
    if (rc || (rc = weft__task_stream("weft_stream_wait", &t, &s)))
        return rc;
    if (p.dev != t->stream_device) { /* another device: the task waits itself */
        if ((rc = weft__task_may_suspend("weft_stream_wait")))
            return rc;
        return p.dev->ops->wait(p.stream, p.seq, WEFT_FOREVER);
    }
    return ops_of(t)->stream_wait(s, p.stream, p.seq);
}

/* NULL is accepted, as free accepts it; a destroyed event is WEFT_ESTATE. */
int weft_event_destroy(weft_event *ev)
{
    return ev ? weft__event_free(ev, "weft_event_destroy") : WEFT_OK;
}

/* ---- host memory and devices ------------------------------------------- */

/* Enter rt (weft__runtime_leave must follow on WEFT_OK) and get its first
 * device. */
static int first_device(weft_runtime *rt, const char *fn, weft__device **dev)
{
    weft__device **devs;
    unsigned n;
    int rc = weft__runtime_enter(rt, fn);
    if (rc)
        return rc;
    if ((rc = weft__runtime_devices(rt, &devs, &n)) == WEFT_OK)
        *dev = devs[0];
    else
        weft__runtime_leave(rt);
    return rc;
}

int weft_host_alloc(weft_runtime *rt, void **ptr, size_t n)
{
    weft__device *dev;
    if (!ptr || !n)
        return weft__fail(WEFT_EINVAL, "weft_host_alloc: %s", ptr ? "n is 0" : "ptr is NULL");
    int rc = first_device(rt, "weft_host_alloc", &dev);
    if (rc)
        return rc;
    rc = dev->ops->host_alloc(dev, ptr, n, false, NULL);
    weft__runtime_leave(rt);
    return rc;
}

static int host_free(weft_runtime *rt, void *ptr, const char *fn)
{
    weft__device *dev;
    int rc = first_device(rt, fn, &dev);
    if (rc)
        return rc;
    if (ptr)
        rc = dev->ops->host_free(dev, ptr, fn);
    weft__runtime_leave(rt);
    return rc;
}

int weft_host_free(weft_runtime *rt, void *ptr)
{
    return host_free(rt, ptr, "weft_host_free");
}

int weft_mapped_alloc(weft_runtime *rt, void **host, void **device, size_t n)
{
    weft__device *dev;
    if (!host || !device || !n)
        return weft__fail(WEFT_EINVAL, "weft_mapped_alloc: %s",
                          n ? "host or device is NULL" : "n is 0");
    int rc = first_device(rt, "weft_mapped_alloc", &dev);
    if (rc)
        return rc;
    rc = dev->ops->host_alloc(dev, host, n, true, device);
    weft__runtime_leave(rt);
    return rc;
}

int weft_mapped_free(weft_runtime *rt, void *host)
{
    return host_free(rt, host, "weft_mapped_free");
}

unsigned weft_device_count(weft_runtime *rt)
{
    weft__device **devs;
    unsigned n;
    if (weft__runtime_enter(rt, "weft_device_count"))
        return 0;
    if (weft__runtime_devices(rt, &devs, &n))
        n = 0;
    weft__runtime_leave(rt);
    return n;
}

const char *weft_backend_name(weft_runtime *rt)
{
    weft__device *dev;
    if (first_device(rt, "weft_backend_name", &dev))
        return "none";
    const char *name = dev->ops->name; /* static: outlives the device */
    weft__runtime_leave(rt);
    return name;
}

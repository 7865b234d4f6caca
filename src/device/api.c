/*
 * api.c - the public calls that put device work on a task's stream.
 *
 * A task leases a stream from its runtime's device on its first enqueue and
 * keeps it until weft_await finds the work complete; a task that returns
 * with work in flight is awaited implicitly, so its stack (which that work
 * may point into) outlives the work. A device failure fails the task: its
 * join returns the failure even if the task ignored it.
 */
#include "device/device.h"
#include "runtime.h"
#include "task/task.h"

/* The calling task and its stream, leasing one if needed. */
static int task_stream(const char *fn, weft__task **tp, weft__stream **sp)
{
    weft__task *t = weft__task_self();
    if (!t)
        return weft__fail(WEFT_ENOTASK, "%s: not called from a task", fn);
    if (!t->stream) {
        weft__device *dev;
        int rc = weft__runtime_device(t->rt, &dev);
        if (rc == WEFT_OK)
            rc = dev->ops->stream_lease(dev, &t->stream);
        if (rc)
            return rc;
    }
    *tp = t;
    *sp = t->stream;
    return WEFT_OK;
}

static const weft__device_ops *ops_of(weft__task *t)
{
    return atomic_load_explicit(&t->rt->device, memory_order_acquire)->ops;
}

int weft_memcpy_async(void *dst, const void *src, size_t n)
{
    weft__task *t;
    weft__stream *s;
    if (n && (!dst || !src))
        return weft__fail(WEFT_EINVAL, "weft_memcpy_async: %s is NULL", dst ? "src" : "dst");
    int rc = task_stream("weft_memcpy_async", &t, &s);
    if (rc || n == 0)
        return rc;
    return ops_of(t)->copy(s, dst, src, n);
}

int weft_memset_async(void *dst, int value, size_t n)
{
    weft__task *t;
    weft__stream *s;
    if (n && !dst)
        return weft__fail(WEFT_EINVAL, "weft_memset_async: dst is NULL");
    int rc = task_stream("weft_memset_async", &t, &s);
    if (rc || n == 0)
        return rc;
    return ops_of(t)->fill(s, dst, value, n);
}

int weft_host_async(void (*fn)(void *arg), void *arg)
{
    weft__task *t;
    weft__stream *s;
    if (!fn)
        return weft__fail(WEFT_EINVAL, "weft_host_async: fn is NULL");
    int rc = task_stream("weft_host_async", &t, &s);
    if (rc)
        return rc;
    return ops_of(t)->host_fn(s, fn, arg);
}

/* Wait for t's stream to drain and give it back; remember a failure. */
static int drain(weft__task *t)
{
    weft__device *dev = atomic_load_explicit(&t->rt->device, memory_order_acquire);
    weft__stream *s = t->stream;
    int rc = dev->ops->sync(s);
    dev->ops->stream_return(dev, s);
    t->stream = NULL;
    if (rc && t->device_status == WEFT_OK)
        t->device_status = rc;
    return rc;
}

int weft_await(void)
{
    weft__task *t = weft__task_self();
    if (!t)
        return weft__fail(WEFT_ENOTASK, "weft_await: not called from a task");
    int rc = t->stream ? drain(t) : WEFT_OK;
    if (rc)
        return rc; /* the backend set the message */
    if (atomic_load(&t->cancelled))
        return weft__fail(WEFT_ECANCELED, "weft_await: the task was cancelled");
    return WEFT_OK;
}

void weft__device_task_exit(weft__task *t)
{
    drain(t);
}

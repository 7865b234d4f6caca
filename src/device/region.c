/*
 * region.c - graph mode's public calls: a task's region of device work,
 * recorded once and replayed.
 *
 * The backend does the recording and the replaying (for CUDA,
 * src/cuda/graph.c); here are the task's side of it: which
 * stream the region's work goes to, the rules (no nesting, no suspending
 * inside: see weft__task_may_suspend), dropping a region that broke
 * them or that its task returned from, and a replay with no recording.
 */
#include "device/device.h"
#include "task/tasks.h"
#include "task/task.h"

static void region_close(weft__task *t)
{
    t->region_open = false;
    t->region_broken = false;
    t->region_stream = NULL;
}

void weft__region_drop(weft__task *t)
{
    if (t->region_stream)
        t->stream_device->ops->region_abandon(t->region_stream);
    region_close(t);
}

int weft_region_begin(uint64_t key)
{
    weft__task *t = NULL;
    weft__stream *s;
    int rc = weft__task_stream("weft_region_begin", &t, &s);
    if (rc)
        return rc;
    if (t->region_open)
        return weft__fail(WEFT_ESTATE, "weft_region_begin: a region is open already");
    const weft__device_ops *ops = t->stream_device->ops;
    t->region_stream = NULL;
    if (ops->region_begin && (rc = ops->region_begin(s, &t->region_stream)))
        return rc;
    t->region_open = true;
    t->region_broken = false;
    t->region_key = key;
    return WEFT_OK;
}

int weft_region_end(void)
{
    weft__task *t = weft__task_self();
    if (!t)
        return weft__fail(WEFT_ENOTASK, "weft_region_end: not called from a task");
    if (!t->region_open)
        return weft__fail(WEFT_ESTATE, "weft_region_end: no region is open");
    bool broken = t->region_broken;
    weft__stream *capture = t->region_stream;
    region_close(t);
    if (!capture) /* the backend ran the region eagerly */
        return broken ? weft__fail(WEFT_ESTATE, "weft_region_end: the task tried to suspend "
                                                "inside the region")
                      : WEFT_OK;
    const weft__device_ops *ops = t->stream_device->ops;
    if (broken) {
        ops->region_abandon(capture);
        return weft__fail(WEFT_ESTATE, "weft_region_end: the task tried to suspend inside the "
                                       "region; its work was dropped");
    }
    if (!weft__trace_on())
        return ops->region_end(t->stream, capture, t->region_key);
    weft__op_bracket b = weft__op_bracket_open(t, t->stream, "weft_region_end", WEFT__OP_GRAPH);
    int rc = ops->region_end(t->stream, capture, t->region_key);
    weft__op_bracket_close(t, t->stream, b, (weft__op_info){.kind = WEFT__OP_GRAPH});
    return rc;
}

int weft_region_replay(uint64_t key, int *replayed)
{
    weft__task *t = NULL;
    weft__stream *s;
    if (!replayed)
        return weft__fail(WEFT_EINVAL, "weft_region_replay: replayed is NULL");
    *replayed = 0;
    int rc = weft__task_stream("weft_region_replay", &t, &s);
    if (rc)
        return rc;
    if (t->region_open)
        return weft__fail(WEFT_ESTATE, "weft_region_replay: a region is open");
    const weft__device_ops *ops = t->stream_device->ops;
    if (!ops->region_replay) /* the backend runs regions eagerly: nothing is kept */
        return WEFT_OK;
    bool done = false;
    if (!weft__trace_on()) {
        rc = ops->region_replay(s, key, &done);
    } else {
        weft__op_bracket b = weft__op_bracket_open(t, s, "weft_region_replay", WEFT__OP_GRAPH);
        rc = ops->region_replay(s, key, &done);
        weft__op_bracket_close(t, s, b, (weft__op_info){.kind = WEFT__OP_GRAPH});
    }
    *replayed = done;
    return rc;
}

int weft_graph_stats_get(weft_runtime *rt, weft_graph_stats *stats)
{
    weft__device **devs;
    unsigned n;
    if (!stats)
        return weft__fail(WEFT_EINVAL, "weft_graph_stats_get: stats is NULL");
    int rc = weft__runtime_enter(rt, "weft_graph_stats_get");
    if (rc)
        return rc;
    if ((rc = weft__runtime_devices(rt, &devs, &n)) == WEFT_OK) {
        *stats = (weft_graph_stats){0};
        for (unsigned i = 0; i < n; i++)
            if (devs[i]->ops->graph_stats)
                devs[i]->ops->graph_stats(devs[i], stats);
    }
    weft__runtime_leave(rt);
    return rc;
}

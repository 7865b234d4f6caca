/*
 * cuda_graph.c - graph mode for the CUDA backend: a task's region of GPU
 * work, recorded by stream capture and launched as one CUDA graph.
 *
 * Each weft_region_end captures the region's work afresh (cheap: nothing
 * runs) and looks for an idle executable graph cached under the same key.
 * cudaGraphExecUpdate then brings that graph up to date with whatever
 * pointers and scalars changed; if the shape of the work changed, the
 * update is refused and the graph is instantiated again. Capture plus
 * update costs a fraction of launching each operation eagerly.
 *
 * Invariants:
 *  - An executable graph runs for one task at a time: from its launch until
 *    its stream has reached busy_until (the marker after the launch, which
 *    the launching task's await writes) nobody else takes it. Tasks running
 *    the same key at once get separate graphs.
 *  - The cache holds at most graph_cap slots per device, at fixed places (a
 *    task holds a pointer to the slot it took). A slot without a graph
 *    (exec NULL) is free; a new graph takes a free slot, else evicts the
 *    least recently used idle one, else is used once and dropped.
 *  - graph_lock guards the cache and the stats; instantiating, updating and
 *    launching happen outside it, on a graph taken (marked busy) under it.
 */
#ifdef WEFT_HAVE_CUDA

#include <stdlib.h>

#include "core/error.h"
#include "device/cuda_internal.h"

typedef struct weft__cuda_graph {
    uint64_t key;
    cudaGraphExec_t exec;
    weft__stream *busy_stream; /* NULL: idle */
    uint64_t busy_until;
    uint64_t last_used;
} cuda_graph;

int weft__cuda_graph_init(weft__cuda_device *dev, unsigned cap)
{
    dev->graph_cap = cap;
    dev->graphs = calloc(cap, sizeof *dev->graphs);
    return dev->graphs ? WEFT_OK : weft__fail(WEFT_ENOMEM, "weft: out of memory for graphs");
}

void weft__cuda_graph_fini(weft__cuda_device *dev)
{
    for (unsigned i = 0; i < dev->ngraphs; i++)
        cudaGraphExecDestroy(dev->graphs[i].exec);
    free(dev->graphs);
    dev->graphs = NULL;
    dev->ngraphs = 0;
}

void weft__cuda_graph_stats(weft__device *d, weft_graph_stats *sum)
{
    weft__cuda_device *dev = (weft__cuda_device *)d;
    weft__lock_acquire(&dev->graph_lock);
    sum->launches += dev->graph_stats.launches;
    sum->updates += dev->graph_stats.updates;
    sum->instantiations += dev->graph_stats.instantiations;
    sum->evictions += dev->graph_stats.evictions;
    weft__lock_release(&dev->graph_lock);
}

/* ---- recording --------------------------------------------------------- */

int weft__cuda_region_begin(weft__stream *s)
{
    int rc = weft__cuda_enter(s, "weft_region_begin");
    if (rc)
        return rc;
    /* Thread-local mode: only this thread's unsafe calls break the capture,
     * and the task cannot move to another thread inside the region. */
    cudaError_t e = cudaStreamBeginCapture(s->handle, cudaStreamCaptureModeThreadLocal);
    return e == cudaSuccess ? WEFT_OK : weft__cuda_fail(s->dev, "cudaStreamBeginCapture", e);
}

void weft__cuda_region_abandon(weft__stream *s)
{
    cudaGraph_t graph = NULL;
    if (cudaStreamEndCapture(s->handle, &graph) == cudaSuccess && graph)
        cudaGraphDestroy(graph);
    cudaGetLastError();
}

/* ---- the cache --------------------------------------------------------- */

static bool idle(cuda_graph *g)
{
    if (g->busy_stream && !weft__cuda_reached(g->busy_stream, g->busy_until))
        return false;
    g->busy_stream = NULL;
    return true;
}

/* Take the most recently used idle graph of key (marked busy for s), or
 * NULL. Call with graph_lock held. */
static cuda_graph *take(weft__cuda_device *dev, uint64_t key, weft__stream *s, uint64_t until)
{
    cuda_graph *best = NULL;
    for (unsigned i = 0; i < dev->ngraphs; i++) {
        cuda_graph *g = &dev->graphs[i];
        if (g->exec && g->key == key && idle(g) && (!best || g->last_used > best->last_used))
            best = g;
    }
    if (best) {
        best->busy_stream = s;
        best->busy_until = until;
        best->last_used = ++dev->graph_clock;
    }
    return best;
}

/* A slot for a new graph: a free one, else the least recently used idle
 * one (evicted), else NULL. Call with graph_lock held. */
static cuda_graph *make_room(weft__cuda_device *dev, cudaGraphExec_t *evicted)
{
    *evicted = NULL;
    for (unsigned i = 0; i < dev->ngraphs; i++)
        if (!dev->graphs[i].exec && !dev->graphs[i].busy_stream)
            return &dev->graphs[i];
    if (dev->ngraphs < dev->graph_cap)
        return &dev->graphs[dev->ngraphs++];
    cuda_graph *lru = NULL;
    for (unsigned i = 0; i < dev->ngraphs; i++) {
        cuda_graph *g = &dev->graphs[i];
        if (g->exec && idle(g) && (!lru || g->last_used < lru->last_used))
            lru = g;
    }
    if (lru) {
        *evicted = lru->exec;
        dev->graph_stats.evictions++;
    }
    return lru;
}

/* ---- replaying --------------------------------------------------------- */

int weft__cuda_region_end(weft__stream *s, uint64_t key)
{
    weft__cuda_device *dev = s->dev;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(s->handle, &graph);
    if (e != cudaSuccess) /* a forbidden call broke the capture; the stream is usable */
        return weft__cuda_fail(dev, "weft_region_end: cudaStreamEndCapture", e);
    int rc = weft__cuda_check_failed(dev, "weft_region_end");
    if (rc)
        goto out;

    weft__lock_acquire(&s->lock);
    uint64_t until = s->marked + 1; /* the marker the task's await writes next */
    weft__lock_release(&s->lock);

    weft__lock_acquire(&dev->graph_lock);
    cuda_graph *g = take(dev, key, s, until);
    weft__lock_release(&dev->graph_lock);

    cudaGraphExec_t exec = NULL;
    bool updated = false;
    if (g) {
        cudaGraphExecUpdateResultInfo info;
        updated = cudaGraphExecUpdate(g->exec, graph, &info) == cudaSuccess;
        if (!updated) { /* another shape: instantiate again, in the same slot */
            cudaGetLastError();
            cudaGraphExecDestroy(g->exec);
            g->exec = NULL;
        }
    }
    if (!updated && (e = cudaGraphInstantiate(&exec, graph, 0)) != cudaSuccess) {
        rc = weft__cuda_fail(dev, "weft_region_end: cudaGraphInstantiate", e);
        if (g) { /* the slot has no graph any more: it is free */
            weft__lock_acquire(&dev->graph_lock);
            g->busy_stream = NULL;
            weft__lock_release(&dev->graph_lock);
        }
        goto out;
    }

    cudaGraphExec_t evicted = NULL;
    weft__lock_acquire(&dev->graph_lock);
    if (g && !updated) {
        g->exec = exec;
    } else if (!g && (g = make_room(dev, &evicted)) != NULL) {
        *g = (cuda_graph){key, exec, s, until, ++dev->graph_clock};
    }
    dev->graph_stats.launches++;
    if (updated)
        dev->graph_stats.updates++;
    else
        dev->graph_stats.instantiations++;
    weft__lock_release(&dev->graph_lock);
    if (evicted)
        cudaGraphExecDestroy(evicted);

    e = cudaGraphLaunch(g ? g->exec : exec, s->handle);
    if (e != cudaSuccess)
        rc = weft__cuda_fail(dev, "weft_region_end: cudaGraphLaunch", e);
    if (!g) /* every cached graph busy: this one runs once */
        cudaGraphExecDestroy(exec); /* CUDA keeps it until its launch is done */
out:
    cudaGraphDestroy(graph);
    return rc;
}

#endif

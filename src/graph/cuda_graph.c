/*
 * cuda_graph.c - graph mode for the CUDA backend: a task's region of GPU
 * work, recorded by stream capture and launched as one CUDA graph.
 *
 * A region's work is captured on a stream of its own (a capture stream,
 * never shared, so no other task's work can slip into the capture; nothing
 * runs there). Each weft_region_end looks for an idle executable graph
 * cached under the same key, and cudaGraphExecUpdate brings it up to date
 * with whatever pointers and scalars changed; if the shape of the work
 * changed, the update is refused and the graph is instantiated again.
 * Capturing and updating every time costs about as much as launching a
 * handful of operations eagerly (bench/RESULTS.md): the gain is in regions
 * of many small operations, and replaying an unchanged region without
 * capturing it again is the next step.
 *
 * Invariants:
 *  - An executable graph runs for one task at a time: from being taken
 *    until its launch stream has reached busy_until (the first marker after
 *    the launch, which the launching task's await writes) nobody else takes
 *    it. Reading the stream's last marker and launching happen under the
 *    stream's lock, so no marker of another task can come between. Tasks
 *    running the same key at once get separate graphs.
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
    uint64_t busy_until;       /* valid once launched */
    bool launched;
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
        if (dev->graphs[i].exec)
            cudaGraphExecDestroy(dev->graphs[i].exec);
    while (dev->captures) {
        weft__stream *c = dev->captures;
        dev->captures = c->next_capture;
        weft__cuda_stream_destroy_bare(c);
    }
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

int weft__cuda_region_begin(weft__stream *s, weft__stream **capture)
{
    weft__cuda_device *dev = s->dev;
    int rc = weft__cuda_enter(s, "weft_region_begin");
    if (rc)
        return rc;
    weft__lock_acquire(&dev->graph_lock);
    weft__stream *c = dev->captures;
    if (c)
        dev->captures = c->next_capture;
    weft__lock_release(&dev->graph_lock);
    if (!c && (rc = weft__cuda_stream_create_bare(dev, &c)))
        return rc;
    /* Thread-local mode: only this thread's unsafe calls break the capture,
     * and the task cannot move to another thread inside the region. */
    cudaError_t e = cudaStreamBeginCapture(c->handle, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        weft__cuda_stream_destroy_bare(c);
        return weft__cuda_fail(dev, "cudaStreamBeginCapture", e);
    }
    *capture = c;
    return WEFT_OK;
}

/* Stop capturing on c and give it back; *graph receives what was recorded
 * (NULL if the capture broke). */
static cudaError_t stop_capture(weft__stream *c, cudaGraph_t *graph)
{
    weft__cuda_device *dev = c->dev;
    *graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->handle, graph);
    weft__lock_acquire(&dev->graph_lock);
    c->next_capture = dev->captures;
    dev->captures = c;
    weft__lock_release(&dev->graph_lock);
    return e;
}

void weft__cuda_region_abandon(weft__stream *capture)
{
    cudaGraph_t graph;
    if (stop_capture(capture, &graph) == cudaSuccess && graph)
        cudaGraphDestroy(graph);
    cudaGetLastError();
}

/* ---- the cache --------------------------------------------------------- */

static bool idle(cuda_graph *g)
{
    if (g->busy_stream &&
        (!g->launched || !weft__cuda_reached(g->busy_stream, g->busy_until)))
        return false;
    g->busy_stream = NULL;
    return true;
}

/* Take the most recently used idle graph of key (marked busy for s), or
 * NULL. Call with graph_lock held. */
static cuda_graph *take(weft__cuda_device *dev, uint64_t key, weft__stream *s)
{
    cuda_graph *best = NULL;
    for (unsigned i = 0; i < dev->ngraphs; i++) {
        cuda_graph *g = &dev->graphs[i];
        if (g->exec && g->key == key && idle(g) && (!best || g->last_used > best->last_used))
            best = g;
    }
    if (best) {
        best->busy_stream = s;
        best->launched = false;
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

/* Launch exec on s; a cached graph g (or NULL) becomes busy until s's next
 * marker. */
static int launch(weft__stream *s, cuda_graph *g, cudaGraphExec_t exec)
{
    weft__cuda_device *dev = s->dev;
    weft__cuda_note_work(s);
    weft__lock_acquire(&s->lock);
    cudaError_t e = cudaGraphLaunch(exec, s->handle);
    if (g) {
        weft__lock_acquire(&dev->graph_lock);
        g->busy_until = s->marked + 1;
        g->launched = true;
        weft__lock_release(&dev->graph_lock);
    }
    weft__lock_release(&s->lock);
    return e == cudaSuccess ? WEFT_OK : weft__cuda_fail(dev, "weft_region_end: cudaGraphLaunch", e);
}

int weft__cuda_region_end(weft__stream *s, weft__stream *capture, uint64_t key)
{
    weft__cuda_device *dev = s->dev;
    cudaGraph_t graph;
    cudaError_t e = stop_capture(capture, &graph);
    if (e != cudaSuccess) /* a forbidden call broke the capture */
        return weft__cuda_fail(dev, "weft_region_end: cudaStreamEndCapture", e);
    int rc = weft__cuda_enter(s, "weft_region_end");
    if (rc)
        goto out;

    weft__lock_acquire(&dev->graph_lock);
    cuda_graph *g = take(dev, key, s);
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
        *g = (cuda_graph){.key = key, .exec = exec, .busy_stream = s,
                          .last_used = ++dev->graph_clock};
    }
    dev->graph_stats.launches++;
    if (updated)
        dev->graph_stats.updates++;
    else
        dev->graph_stats.instantiations++;
    weft__lock_release(&dev->graph_lock);
    if (evicted)
        cudaGraphExecDestroy(evicted);

    rc = launch(s, g, g ? g->exec : exec);
    if (!g) /* every cached graph busy: this one runs once; CUDA frees it after */
        cudaGraphExecDestroy(exec);
out:
    if (graph)
        cudaGraphDestroy(graph);
    return rc;
}

#endif

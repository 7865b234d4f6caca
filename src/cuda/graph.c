/*
 * graph.c - graph mode for the CUDA backend: a task's region of GPU
 * work, launched as one CUDA graph and cached under the region's key.
 *
 * A region's work goes to a stream of its own (a capture stream, never
 * shared, so no other task's work can slip in; nothing runs there). It
 * starts out recording: its kernel launches, memsets and copies are kept
 * as data (record.c). At weft_region_end an idle executable graph of
 * the same key recorded from the same operations is brought up to date by
 * setting the nodes whose parameters changed, and launched; otherwise one
 * is built from the record and instantiated. Work that cannot be recorded
 * turns the region into a stream capture; then cudaGraphExecUpdate brings
 * a cached graph up to date, and a refused update (another shape) means
 * instantiating again. weft_region_replay launches an idle graph of the
 * key as its nodes stand, recording nothing (the caller's promise that
 * the work would be the same).
 *
 * Invariants:
 *  - An executable graph serves one task at a time: from being taken until
 *    its launch stream has reached busy_until (the first marker after the
 *    launch, which the launching task's await writes) no task on another
 *    stream takes it. Reading the stream's last marker and launching happen
 *    under the stream's lock, so no marker of another task can come
 *    between. Tasks running the same key at once get separate graphs. The
 *    task that launched it may take it again at once: CUDA orders launches
 *    of one executable graph, and changing its nodes affects only later
 *    launches.
 *  - A graph built from a record keeps that graph, its nodes and the record
 *    (graph, nodes, record), which say what its nodes hold now; a captured
 *    one keeps none of them.
 *  - The cache holds at most graph_cap slots per device, at fixed places (a
 *    task holds a pointer to the slot it took). A slot without a graph
 *    (exec NULL) is free; a new graph takes a free slot, else evicts the
 *    least recently used idle one, else is used once and dropped.
 *  - graph_lock guards the cache and the stats; instantiating, updating and
 *    launching happen outside it, on a graph taken (marked busy) under it.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "cuda/backend.h"

typedef struct weft__cuda_graph {
    uint64_t key;
    cudaGraphExec_t exec;
    cudaGraph_t graph; /* built from record; NULL when captured */
    cudaGraphNode_t *nodes;
    weft__cuda_record *record;
    weft__stream *busy_stream; /* NULL: idle */
    uint64_t busy_until;       /* valid once launched */
    bool launched;
    uint64_t last_used;
} cuda_graph;

int weft__cuda_graph_init(weft__cuda_device *dev, unsigned cap)
{
    dev->graph.graph_cap = cap;
    dev->graph.graphs = calloc(cap, sizeof *dev->graph.graphs);
    return dev->graph.graphs ? WEFT_OK : weft__fail(WEFT_ENOMEM, "weft: out of memory for graphs");
}

/* Free what a slot held (a copy of it, taken under graph_lock). */
static void release(const cuda_graph *g)
{
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    if (g->graph)
        cudaGraphDestroy(g->graph);
    free(g->nodes);
    weft__cuda_record_free(g->record);
}

void weft__cuda_graph_fini(weft__cuda_device *dev)
{
    for (unsigned i = 0; i < dev->graph.ngraphs; i++)
        release(&dev->graph.graphs[i]);
    while (dev->graph.captures) {
        weft__stream *c = dev->graph.captures;
        dev->graph.captures = c->graph.next_capture;
        weft__cuda_record_free(c->graph.record);
        weft__cuda_stream_destroy_bare(c);
    }
    free(dev->graph.graphs);
    dev->graph.graphs = NULL;
    dev->graph.ngraphs = 0;
}

void weft__cuda_graph_stats(weft__device *d, weft_graph_stats *sum)
{
    weft__cuda_device *dev = (weft__cuda_device *)d;
    weft__lock_acquire(&dev->graph.graph_lock);
    sum->launches += dev->graph.graph_stats.launches;
    sum->updates += dev->graph.graph_stats.updates;
    sum->instantiations += dev->graph.graph_stats.instantiations;
    sum->evictions += dev->graph.graph_stats.evictions;
    sum->hits += dev->graph.graph_stats.hits;
    weft__lock_release(&dev->graph.graph_lock);
}

/* ---- recording --------------------------------------------------------- */

int weft__cuda_region_begin(weft__stream *s, weft__stream **capture)
{
    weft__cuda_device *dev = s->dev;
    int rc = weft__cuda_enter(s, "weft_region_begin");
    if (rc)
        return rc;
    weft__lock_acquire(&dev->graph.graph_lock);
    weft__stream *c = dev->graph.captures;
    if (c)
        dev->graph.captures = c->graph.next_capture;
    weft__lock_release(&dev->graph.graph_lock);
    if (!c && (rc = weft__cuda_stream_create_bare(dev, &c)))
        return rc;
    if (!c->graph.record && !(c->graph.record = weft__cuda_record_new())) {
        weft__cuda_stream_destroy_bare(c);
        return weft__fail(WEFT_ENOMEM, "weft_region_begin: out of memory");
    }
    weft__cuda_record_reset(c->graph.record);
    c->graph.recording = true;
    *capture = c;
    return WEFT_OK;
}

static void give_back(weft__stream *c)
{
    weft__cuda_device *dev = c->dev;
    c->graph.recording = false;
    weft__lock_acquire(&dev->graph.graph_lock);
    c->graph.next_capture = dev->graph.captures;
    dev->graph.captures = c;
    weft__lock_release(&dev->graph.graph_lock);
}

int weft__cuda_region_capture(weft__stream *c)
{
    if (!c->graph.recording)
        return WEFT_OK;
    c->graph.recording = false;
    /* Thread-local mode: only this thread's unsafe calls break the capture,
     * and the task cannot move to another thread inside the region. */
    cudaError_t e = cudaStreamBeginCapture(c->handle, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess)
        return weft__cuda_fail(c->dev, "weft_region: cudaStreamBeginCapture", e);
    if ((e = weft__cuda_record_enqueue(c->graph.record, c->handle)) != cudaSuccess)
        return weft__cuda_fail(c->dev, "weft_region: enqueueing the recorded work", e);
    return WEFT_OK;
}

/* Stop capturing on c and give it back; *graph receives what was captured
 * (NULL if the capture broke). */
static cudaError_t stop_capture(weft__stream *c, cudaGraph_t *graph)
{
    *graph = NULL;
    cudaError_t e = cudaStreamEndCapture(c->handle, graph);
    give_back(c);
    return e;
}

void weft__cuda_region_abandon(weft__stream *capture)
{
    cudaGraph_t graph;
    if (capture->graph.recording) {
        give_back(capture);
        return;
    }
    if (stop_capture(capture, &graph) == cudaSuccess && graph)
        cudaGraphDestroy(graph);
    cudaGetLastError();
}

/* ---- the cache --------------------------------------------------------- */

/* Is g free for s: not taken, or launched by s itself, or run to the end? */
static bool idle(cuda_graph *g, weft__stream *s)
{
    if (!g->busy_stream)
        return true;
    if (!g->launched)
        return false;
    if (g->busy_stream == s)
        return true;
    if (!weft__cuda_reached(g->busy_stream, g->busy_until))
        return false;
    g->busy_stream = NULL;
    return true;
}

/* Take the most recently used idle graph of key (marked busy for s), or
 * NULL. Call with graph_lock held. */
static cuda_graph *take(weft__cuda_device *dev, uint64_t key, weft__stream *s)
{
    cuda_graph *best = NULL;
    for (unsigned i = 0; i < dev->graph.ngraphs; i++) {
        cuda_graph *g = &dev->graph.graphs[i];
        if (g->exec && g->key == key && idle(g, s) && (!best || g->last_used > best->last_used))
            best = g;
    }
    if (best) {
        best->busy_stream = s;
        best->launched = false;
        best->last_used = ++dev->graph.graph_clock;
    }
    return best;
}

/* A slot for a new graph: a free one, else the least recently used idle
 * one (its contents moved to *evicted), else NULL. Call with graph_lock
 * held. */
static cuda_graph *make_room(weft__cuda_device *dev, weft__stream *s, cuda_graph *evicted)
{
    *evicted = (cuda_graph){0};
    for (unsigned i = 0; i < dev->graph.ngraphs; i++)
        if (!dev->graph.graphs[i].exec && !dev->graph.graphs[i].busy_stream)
            return &dev->graph.graphs[i];
    if (dev->graph.ngraphs < dev->graph.graph_cap)
        return &dev->graph.graphs[dev->graph.ngraphs++];
    cuda_graph *lru = NULL;
    for (unsigned i = 0; i < dev->graph.ngraphs; i++) {
        cuda_graph *g = &dev->graph.graphs[i];
        if (g->exec && idle(g, s) && (!lru || g->last_used < lru->last_used))
            lru = g;
    }
    if (lru) {
        *evicted = *lru;
        *lru = (cuda_graph){0};
        dev->graph.graph_stats.evictions++;
    }
    return lru;
}

/* ---- replaying --------------------------------------------------------- */

/* Launch exec on s for op and count it; a cached graph g (or NULL)
 * becomes busy until s's next marker. */
static int launch(const char *op, weft__stream *s, cuda_graph *g, cudaGraphExec_t exec, bool hit,
                  bool updated)
{
    weft__cuda_device *dev = s->dev;
    weft__cuda_note_work(s);
    weft__lock_acquire(&s->lock);
    cudaError_t e = cudaGraphLaunch(exec, s->handle);
    weft__lock_acquire(&dev->graph.graph_lock);
    if (g) {
        g->busy_until = s->marked + 1;
        g->launched = true;
    }
    dev->graph.graph_stats.launches++;
    dev->graph.graph_stats.hits += hit;
    dev->graph.graph_stats.updates += updated;
    weft__lock_release(&dev->graph.graph_lock);
    weft__lock_release(&s->lock);
    if (e == cudaSuccess)
        return WEFT_OK;
    char what[64];
    snprintf(what, sizeof what, "%s: cudaGraphLaunch", op);
    return weft__cuda_fail(dev, what, e);
}

/* Put a newly instantiated exec (with what it was built from, if
 * anything) in g, or in a slot made for it; NULL when every slot is busy
 * (then it is launched once and dropped). */
static cuda_graph *store(weft__stream *s, cuda_graph *g, uint64_t key, cuda_graph made)
{
    weft__cuda_device *dev = s->dev;
    cuda_graph old = {0};
    weft__lock_acquire(&dev->graph.graph_lock);
    dev->graph.graph_stats.instantiations++;
    if (g)
        old = *g;
    else
        g = make_room(dev, s, &old);
    if (g) {
        made.key = key;
        made.busy_stream = s;
        made.last_used = ++dev->graph.graph_clock;
        *g = made;
    }
    weft__lock_release(&dev->graph.graph_lock);
    release(&old);
    return g;
}

/* Give a taken slot back without a graph: it is free. */
static void drop(weft__cuda_device *dev, cuda_graph *g)
{
    cuda_graph old = *g;
    weft__lock_acquire(&dev->graph.graph_lock);
    *g = (cuda_graph){0};
    weft__lock_release(&dev->graph.graph_lock);
    release(&old);
}

/* Launch what g holds (or made, used once) and count it. */
static int finish(weft__stream *s, cuda_graph *g, cuda_graph *made, bool hit, bool updated)
{
    int rc = launch("weft_region_end", s, g, g ? g->exec : made->exec, hit, updated);
    if (!g) /* CUDA frees an executable graph in flight once it is done */
        release(made);
    return rc;
}

/* A region that was recorded: replay a cached graph of the same shape, or
 * build and instantiate one. */
static int end_recorded(weft__stream *s, weft__stream *c, uint64_t key)
{
    weft__cuda_device *dev = s->dev;
    weft__cuda_record *r = c->graph.record;
    int rc = weft__cuda_enter(s, "weft_region_end");
    if (rc || weft__cuda_record_length(r) == 0) { /* nothing to launch */
        give_back(c);
        return rc;
    }
    weft__lock_acquire(&dev->graph.graph_lock);
    cuda_graph *g = take(dev, key, s);
    weft__lock_release(&dev->graph.graph_lock);

    if (g && g->record && weft__cuda_record_same_shape(g->record, r)) {
        unsigned changed;
        cudaError_t e = weft__cuda_record_apply(g->exec, g->nodes, g->record, r, &changed);
        if (e == cudaSuccess) { /* the slot's record now says what its nodes hold */
            c->graph.record = g->record;
            g->record = r;
            give_back(c);
            return finish(s, g, NULL, true, changed > 0);
        }
        cudaGetLastError(); /* a node refused (say, other memory kinds): build anew */
    }

    cuda_graph made = {0};
    cudaError_t e = weft__cuda_record_build(r, &made.graph, &made.nodes);
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&made.exec, made.graph, 0);
    if (e != cudaSuccess) {
        release(&made);
        if (g)
            drop(dev, g);
        give_back(c);
        return weft__cuda_fail(dev, "weft_region_end: building the graph", e);
    }
    made.record = r; /* the graph keeps the record; the capture stream gets a new one */
    c->graph.record = NULL;
    give_back(c);
    g = store(s, g, key, made);
    return finish(s, g, &made, false, false);
}

/* A region that was captured: update a cached graph with the capture, or
 * instantiate it. */
static int end_captured(weft__stream *s, weft__stream *c, uint64_t key)
{
    weft__cuda_device *dev = s->dev;
    cudaGraph_t graph;
    cudaError_t e = stop_capture(c, &graph);
    if (e != cudaSuccess) /* a forbidden call broke the capture */
        return weft__cuda_fail(dev, "weft_region_end: cudaStreamEndCapture", e);
    int rc = weft__cuda_enter(s, "weft_region_end");
    if (rc) {
        cudaGraphDestroy(graph);
        return rc;
    }

    weft__lock_acquire(&dev->graph.graph_lock);
    cuda_graph *g = take(dev, key, s);
    weft__lock_release(&dev->graph.graph_lock);

    if (g) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(g->exec, graph, &info) == cudaSuccess) {
            cudaGraphDestroy(graph);
            if (g->record) { /* its nodes no longer hold what the record says */
                cuda_graph old = {.graph = g->graph, .nodes = g->nodes, .record = g->record};
                g->graph = NULL;
                g->nodes = NULL;
                g->record = NULL;
                release(&old);
            }
            return finish(s, g, NULL, false, true);
        }
        cudaGetLastError(); /* another shape: instantiate again, in the same slot */
    }
    cuda_graph made = {0};
    e = cudaGraphInstantiate(&made.exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        if (g)
            drop(dev, g);
        return weft__cuda_fail(dev, "weft_region_end: cudaGraphInstantiate", e);
    }
    g = store(s, g, key, made);
    return finish(s, g, &made, false, false);
}

int weft__cuda_region_end(weft__stream *s, weft__stream *capture, uint64_t key)
{
    return capture->graph.recording ? end_recorded(s, capture, key) : end_captured(s, capture, key);
}

/* The idle graph of key launched as its nodes stand, nothing recorded. */
int weft__cuda_region_replay(weft__stream *s, uint64_t key, bool *replayed)
{
    weft__cuda_device *dev = s->dev;
    *replayed = false;
    int rc = weft__cuda_enter(s, "weft_region_replay");
    if (rc)
        return rc;
    weft__lock_acquire(&dev->graph.graph_lock);
    cuda_graph *g = take(dev, key, s);
    weft__lock_release(&dev->graph.graph_lock);
    if (!g)
        return WEFT_OK;
    *replayed = true;
    return launch("weft_region_replay", s, g, g->exec, true, false);
}

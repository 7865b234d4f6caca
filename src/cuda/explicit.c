/*
 * explicit.c - graphs built by hand: nodes with explicit dependencies,
 * conditional IF and WHILE nodes, launched from a task.
 *
 * A weft_graph wraps a cudaGraph_t and the nodes added so far, numbered in
 * order, so that dependencies are plain numbers a caller can keep in an
 * array. Conditional bodies are weft_graphs too, wrapping the graphs CUDA
 * creates with the node; they belong to the root graph, which frees them.
 *
 * One executable graph per root, made at the first launch: CUDA allows a
 * graph with conditional nodes only one instantiation at a time, and a
 * graph cannot run beside itself anyway (CUDA orders its launches). Its
 * lock guards instantiating and launching, which may come from tasks on
 * several workers at once.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/lock.h"
#include "cuda/backend.h"
#include "task/tasks.h"
#include "task/task.h"
#include "trace/trace.h"
#include "weft.h"

struct weft_graph {
    weft_runtime *rt;
    weft_graph *root; /* itself, or the graph a body belongs to */
    cudaGraph_t graph;
    cudaGraphNode_t *nodes;
    uint32_t nnodes, cap;
    weft_graph **bodies; /* a root's conditional bodies, freed with it */
    unsigned nbodies;

    weft__lock lock; /* a root's: guards exec */
    cudaGraphExec_t exec;
    int ordinal; /* the GPU exec was made for */
};

int weft_graph_create(weft_runtime *rt, weft_graph **out)
{
    if (!out)
        return weft__fail(WEFT_EINVAL, "weft_graph_create: g is NULL");
    *out = NULL;
    weft__device **devs;
    unsigned n;
    int rc = weft__runtime_enter(rt, "weft_graph_create");
    if (rc)
        return rc;
    if ((rc = weft__runtime_devices(rt, &devs, &n)) == WEFT_OK &&
        strcmp(devs[0]->ops->name, "cuda") != 0)
        rc = weft__fail(WEFT_EINVAL,
                        "weft_graph_create: explicit graphs need the CUDA "
                        "backend; this runtime runs on %s",
                        devs[0]->ops->name);
    weft__runtime_leave(rt);
    if (rc)
        return rc;
    weft_graph *g = calloc(1, sizeof *g);
    if (!g)
        return weft__fail(WEFT_ENOMEM, "weft_graph_create: out of memory");
    cudaError_t e = cudaGraphCreate(&g->graph, 0);
    if (e != cudaSuccess) {
        free(g);
        return weft__fail(WEFT_EDEVICE, "weft_graph_create: cudaGraphCreate: %s",
                          cudaGetErrorName(e));
    }
    g->rt = rt;
    g->root = g;
    *out = g;
    return WEFT_OK;
}

static void free_wrapper(weft_graph *g)
{
    free(g->nodes);
    free(g->bodies);
    free(g);
}

int weft_graph_destroy(weft_graph *g)
{
    if (!g)
        return weft__fail(WEFT_EINVAL, "weft_graph_destroy: g is NULL");
    if (g->root != g)
        return weft__fail(WEFT_EINVAL, "weft_graph_destroy: a conditional body belongs to its "
                                       "node's graph; destroy that one");
    for (unsigned i = 0; i < g->nbodies; i++) /* CUDA owns their graphs */
        free_wrapper(g->bodies[i]);
    if (g->exec) /* freed by CUDA once launches in flight are done */
        cudaGraphExecDestroy(g->exec);
    cudaGraphDestroy(g->graph);
    free_wrapper(g);
    return WEFT_OK;
}

/* ---- adding nodes -------------------------------------------------------- */

/* Check what every add call gets, and gather the dependencies' handles
 * (*deps_out points into scratch or is NULL). */
static int begin_add(const char *fn, weft_graph *g, const weft_graph_node *deps, size_t ndeps,
                     cudaGraphNode_t *scratch, size_t scratch_len, cudaGraphNode_t **deps_out)
{
    *deps_out = NULL;
    if (!g)
        return weft__fail(WEFT_EINVAL, "%s: g is NULL", fn);
    if (g->root->exec)
        return weft__fail(WEFT_ESTATE, "%s: the graph was launched already; it is sealed", fn);
    if (ndeps && !deps)
        return weft__fail(WEFT_EINVAL, "%s: deps is NULL with ndeps %zu", fn, ndeps);
    if (ndeps > scratch_len)
        return weft__fail(WEFT_EINVAL, "%s: %zu dependencies; at most %zu", fn, ndeps, scratch_len);
    for (size_t i = 0; i < ndeps; i++) {
        if (deps[i] >= g->nnodes)
            return weft__fail(WEFT_EINVAL,
                              "%s: dependency %u is not a node of this graph (it "
                              "has %u)",
                              fn, deps[i], g->nnodes);
        for (size_t j = 0; j < i; j++)
            if (deps[j] == deps[i])
                return weft__fail(WEFT_EINVAL, "%s: dependency %u is listed twice", fn, deps[i]);
        scratch[i] = g->nodes[deps[i]];
    }
    if (g->nnodes == g->cap) {
        uint32_t cap = g->cap ? 2 * g->cap : 16;
        cudaGraphNode_t *nodes = realloc(g->nodes, cap * sizeof *nodes);
        if (!nodes)
            return weft__fail(WEFT_ENOMEM, "%s: out of memory", fn);
        g->nodes = nodes;
        g->cap = cap;
    }
    if (ndeps)
        *deps_out = scratch;
    return WEFT_OK;
}

/* Number the node CUDA added, or report why it did not. */
static int end_add(const char *fn, weft_graph *g, weft_graph_node *node, cudaError_t e)
{
    if (e != cudaSuccess) {
        cudaGetLastError();
        int rc = e == cudaErrorMemoryAllocation ? WEFT_ENOMEM : WEFT_EINVAL;
        return weft__fail(rc, "%s: %s", fn, cudaGetErrorName(e));
    }
    if (node)
        *node = g->nnodes;
    g->nnodes++;
    return WEFT_OK;
}

enum { MAX_DEPS = 64 };

/* The common head of the add calls: checks, then dep and slot are ready. */
#define ADD_BEGIN(fn)                                                                              \
    cudaGraphNode_t scratch[MAX_DEPS], *dep;                                                       \
    int rc = begin_add(fn, g, deps, ndeps, scratch, MAX_DEPS, &dep);                               \
    if (rc)                                                                                        \
        return rc;                                                                                 \
    cudaGraphNode_t *slot = &g->nodes[g->nnodes]

int weft_graph_add_kernel(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                          size_t ndeps, const void *kernel, weft_dim3 grid, weft_dim3 block,
                          size_t shared_bytes, void **args)
{
    static const char fn[] = "weft_graph_add_kernel";
    ADD_BEGIN(fn);
    if (!kernel)
        return weft__fail(WEFT_EINVAL, "%s: kernel is NULL", fn);
    struct cudaKernelNodeParams kp = {
        .func = (void *)kernel,
        .gridDim = {grid.x, grid.y, grid.z},
        .blockDim = {block.x, block.y, block.z},
        .sharedMemBytes = (unsigned)shared_bytes,
        .kernelParams = args,
    };
    return end_add(fn, g, node, cudaGraphAddKernelNode(slot, g->graph, dep, ndeps, &kp));
}

/* Graph copies and fills happen on the device: host memory must be pinned
 * or mapped. */
static int check_addressable(const char *fn, const char *what, const void *p)
{
    if (!p)
        return weft__fail(WEFT_EINVAL, "%s: %s is NULL", fn, what);
    if (weft__cuda_pageable(p))
        return weft__fail(WEFT_EINVAL,
                          "%s: %s is pageable host memory, which a graph cannot "
                          "reach; use weft_host_alloc or device memory",
                          fn, what);
    return WEFT_OK;
}

int weft_graph_add_copy(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                        size_t ndeps, void *dst, const void *src, size_t n)
{
    static const char fn[] = "weft_graph_add_copy";
    ADD_BEGIN(fn);
    if (!n)
        return weft__fail(WEFT_EINVAL, "%s: n is 0", fn);
    if ((rc = check_addressable(fn, "dst", dst)) || (rc = check_addressable(fn, "src", src)))
        return rc;
    return end_add(
        fn, g, node,
        cudaGraphAddMemcpyNode1D(slot, g->graph, dep, ndeps, dst, src, n, cudaMemcpyDefault));
}

int weft_graph_add_fill(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                        size_t ndeps, void *dst, int value, size_t n)
{
    static const char fn[] = "weft_graph_add_fill";
    ADD_BEGIN(fn);
    if (!n)
        return weft__fail(WEFT_EINVAL, "%s: n is 0", fn);
    if ((rc = check_addressable(fn, "dst", dst)))
        return rc;
    struct cudaMemsetParams mp = {
        .dst = dst,
        .value = (unsigned char)value,
        .elementSize = 1,
        .width = n,
        .height = 1,
    };
    return end_add(fn, g, node, cudaGraphAddMemsetNode(slot, g->graph, dep, ndeps, &mp));
}

int weft_graph_add_host(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                        size_t ndeps, void (*fn_)(void *arg), void *arg)
{
    static const char fn[] = "weft_graph_add_host";
    ADD_BEGIN(fn);
    if (!fn_)
        return weft__fail(WEFT_EINVAL, "%s: fn is NULL", fn);
    struct cudaHostNodeParams hp = {.fn = fn_, .userData = arg};
    return end_add(fn, g, node, cudaGraphAddHostNode(slot, g->graph, dep, ndeps, &hp));
}

int weft_graph_add_event_record(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                                size_t ndeps, void *cuda_event)
{
    static const char fn[] = "weft_graph_add_event_record";
    ADD_BEGIN(fn);
    if (!cuda_event)
        return weft__fail(WEFT_EINVAL, "%s: the event is NULL", fn);
    return end_add(fn, g, node,
                   cudaGraphAddEventRecordNode(slot, g->graph, dep, ndeps, cuda_event));
}

int weft_graph_add_event_wait(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                              size_t ndeps, void *cuda_event)
{
    static const char fn[] = "weft_graph_add_event_wait";
    ADD_BEGIN(fn);
    if (!cuda_event)
        return weft__fail(WEFT_EINVAL, "%s: the event is NULL", fn);
    return end_add(fn, g, node, cudaGraphAddEventWaitNode(slot, g->graph, dep, ndeps, cuda_event));
}

int weft_graph_add_child(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                         size_t ndeps, const weft_graph *child)
{
    static const char fn[] = "weft_graph_add_child";
    ADD_BEGIN(fn);
    if (!child || child->root == g->root)
        return weft__fail(WEFT_EINVAL, "%s: the child is NULL or part of this graph", fn);
    return end_add(fn, g, node,
                   cudaGraphAddChildGraphNode(slot, g->graph, dep, ndeps, child->graph));
}

/* ---- conditional nodes --------------------------------------------------- */

int weft_graph_cond_create(weft_graph *g, weft_graph_cond *cond, unsigned initial)
{
    static const char fn[] = "weft_graph_cond_create";
    if (!g || !cond)
        return weft__fail(WEFT_EINVAL, "%s: g or cond is NULL", fn);
    if (g->root->exec)
        return weft__fail(WEFT_ESTATE, "%s: the graph was launched already; it is sealed", fn);
    cudaGraphConditionalHandle h;
    cudaError_t e =
        cudaGraphConditionalHandleCreate(&h, g->graph, initial, cudaGraphCondAssignDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return weft__fail(WEFT_EINVAL, "%s: cudaGraphConditionalHandleCreate: %s", fn,
                          cudaGetErrorName(e));
    }
    *cond = h;
    return WEFT_OK;
}

static int add_conditional(const char *fn, weft_graph *g, weft_graph_node *node,
                           const weft_graph_node *deps, size_t ndeps, weft_graph_cond cond,
                           enum cudaGraphConditionalNodeType type, weft_graph **body)
{
    ADD_BEGIN(fn);
    if (!body)
        return weft__fail(WEFT_EINVAL, "%s: body is NULL", fn);
    weft_graph *root = g->root;
    weft_graph *b = calloc(1, sizeof *b);
    weft_graph **bodies = realloc(root->bodies, (root->nbodies + 1) * sizeof *bodies);
    if (!b || !bodies) {
        free(b);
        if (bodies)
            root->bodies = bodies;
        return weft__fail(WEFT_ENOMEM, "%s: out of memory", fn);
    }
    root->bodies = bodies;
    struct cudaGraphNodeParams params = {.type = cudaGraphNodeTypeConditional};
    params.conditional.handle = cond;
    params.conditional.type = type;
    params.conditional.size = 1;
    cudaError_t e = cudaGraphAddNode(slot, g->graph, dep, NULL, ndeps, &params);
    if ((rc = end_add(fn, g, node, e))) {
        free(b);
        return rc;
    }
    *b = (weft_graph){.rt = g->rt, .root = root, .graph = params.conditional.phGraph_out[0]};
    root->bodies[root->nbodies++] = b;
    *body = b;
    return WEFT_OK;
}

int weft_graph_add_if(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                      size_t ndeps, weft_graph_cond cond, weft_graph **body)
{
    return add_conditional("weft_graph_add_if", g, node, deps, ndeps, cond, cudaGraphCondTypeIf,
                           body);
}

int weft_graph_add_while(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                         size_t ndeps, weft_graph_cond cond, weft_graph **body)
{
    return add_conditional("weft_graph_add_while", g, node, deps, ndeps, cond,
                           cudaGraphCondTypeWhile, body);
}

/* ---- launching ----------------------------------------------------------- */

int weft_graph_launch(weft_graph *g)
{
    static const char fn[] = "weft_graph_launch";
    weft__task *t = NULL;
    weft__stream *s;
    if (!g)
        return weft__fail(WEFT_EINVAL, "%s: g is NULL", fn);
    if (g->root != g)
        return weft__fail(WEFT_EINVAL, "%s: a conditional body runs as part of its graph", fn);
    int rc = weft__task_stream(fn, &t, &s);
    if (rc)
        return rc;
    if (t->rt != g->rt)
        return weft__fail(WEFT_EINVAL, "%s: the graph belongs to another runtime", fn);
    if ((rc = weft__cuda_enter(s, fn)) ||
        (s->graph.recording && (rc = weft__cuda_region_capture(s)))) /* inside a region */
        return rc;

    weft__cuda_note_work(s);
    weft__lock_acquire(&g->lock);
    cudaError_t e = cudaSuccess;
    if (!g->exec) {
        if ((e = cudaGraphInstantiate(&g->exec, g->graph, 0)) != cudaSuccess) {
            g->exec = NULL;
            weft__lock_release(&g->lock);
            return weft__cuda_fail(s->dev, "weft_graph_launch: cudaGraphInstantiate", e);
        }
        g->ordinal = s->dev->ordinal;
    } else if (g->ordinal != s->dev->ordinal) {
        weft__lock_release(&g->lock);
        return weft__fail(WEFT_EINVAL,
                          "%s: the graph was made for GPU %d; this task runs on "
                          "GPU %d",
                          fn, g->ordinal, s->dev->ordinal);
    }
    /* timed on the device for the timeline, as other work is */
    if (weft__trace_on()) {
        weft__op_bracket b = weft__op_bracket_open(t, s, fn, WEFT__OP_GRAPH);
        e = cudaGraphLaunch(g->exec, s->handle);
        weft__op_bracket_close(t, s, b, (weft__op_info){.kind = WEFT__OP_GRAPH});
    } else {
        e = cudaGraphLaunch(g->exec, s->handle);
    }
    weft__lock_release(&g->lock);
    return e == cudaSuccess ? WEFT_OK
                            : weft__cuda_fail(s->dev, "weft_graph_launch: cudaGraphLaunch", e);
}

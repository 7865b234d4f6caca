/*
 * no_cuda.c - the CUDA backend's interface in a build without CUDA: the
 * build compiles this file in place of src/cuda/ (CMakeLists.txt), as
 * libuv compiles one platform's files. It finds no GPU, so the runtime
 * serves every task with the host backend, and it refuses explicit graphs,
 * which only CUDA can build: no weft_graph can exist, so every other
 * weft_graph_* call has been handed something that is not one.
 */
#include <stddef.h>

#include "core/error.h"
#include "device/device.h"
#include "weft.h"

int weft__cuda_devices_create(weft__device ***devs, unsigned *count, unsigned graph_cache)
{
    (void)graph_cache;
    *devs = NULL;
    *count = 0;
    return WEFT_OK;
}

int weft_graph_create(weft_runtime *rt, weft_graph **g)
{
    (void)rt;
    if (g)
        *g = NULL;
    return weft__fail(WEFT_EINVAL, "weft_graph_create: explicit graphs need the CUDA backend, "
                                   "and weft was built without CUDA");
}

/* No graph can exist, so every other call has been handed something else. */
static int no_graph(const char *fn)
{
    return weft__fail(WEFT_EINVAL, "%s: not a graph (weft was built without CUDA)", fn);
}

int weft_graph_destroy(weft_graph *g)
{
    (void)g;
    return no_graph("weft_graph_destroy");
}

int weft_graph_add_kernel(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                          size_t ndeps, const void *kernel, weft_dim3 grid, weft_dim3 block,
                          size_t shared_bytes, void **args)
{
    (void)g, (void)node, (void)deps, (void)ndeps, (void)kernel, (void)grid, (void)block;
    (void)shared_bytes, (void)args;
    return no_graph("weft_graph_add_kernel");
}

int weft_graph_add_copy(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                        size_t ndeps, void *dst, const void *src, size_t n)
{
    (void)g, (void)node, (void)deps, (void)ndeps, (void)dst, (void)src, (void)n;
    return no_graph("weft_graph_add_copy");
}

int weft_graph_add_fill(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                        size_t ndeps, void *dst, int value, size_t n)
{
    (void)g, (void)node, (void)deps, (void)ndeps, (void)dst, (void)value, (void)n;
    return no_graph("weft_graph_add_fill");
}

int weft_graph_add_host(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                        size_t ndeps, void (*fn)(void *arg), void *arg)
{
    (void)g, (void)node, (void)deps, (void)ndeps, (void)fn, (void)arg;
    return no_graph("weft_graph_add_host");
}

int weft_graph_add_event_record(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                                size_t ndeps, void *cuda_event)
{
    (void)g, (void)node, (void)deps, (void)ndeps, (void)cuda_event;
    return no_graph("weft_graph_add_event_record");
}

int weft_graph_add_event_wait(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                              size_t ndeps, void *cuda_event)
{
    (void)g, (void)node, (void)deps, (void)ndeps, (void)cuda_event;
    return no_graph("weft_graph_add_event_wait");
}

int weft_graph_add_child(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                         size_t ndeps, const weft_graph *child)
{
    (void)g, (void)node, (void)deps, (void)ndeps, (void)child;
    return no_graph("weft_graph_add_child");
}

int weft_graph_cond_create(weft_graph *g, weft_graph_cond *cond, unsigned initial)
{
    (void)g, (void)cond, (void)initial;
    return no_graph("weft_graph_cond_create");
}

int weft_graph_add_if(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                      size_t ndeps, weft_graph_cond cond, weft_graph **body)
{
    (void)g, (void)node, (void)deps, (void)ndeps, (void)cond, (void)body;
    return no_graph("weft_graph_add_if");
}

int weft_graph_add_while(weft_graph *g, weft_graph_node *node, const weft_graph_node *deps,
                         size_t ndeps, weft_graph_cond cond, weft_graph **body)
{
    (void)g, (void)node, (void)deps, (void)ndeps, (void)cond, (void)body;
    return no_graph("weft_graph_add_while");
}

int weft_graph_launch(weft_graph *g)
{
    (void)g;
    return no_graph("weft_graph_launch");
}

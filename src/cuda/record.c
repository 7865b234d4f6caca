/*
 * record.c - graph mode's fast path: a region's operations kept as
 * data rather than captured, so that a region that repeats is compared with
 * its cached graph and replayed without being captured again.
 *
 * Kernel launches, and memsets and copies of memory the device addresses,
 * are recorded. A launch's arguments are copied at once (their sizes come
 * from the kernel's parameter table), so the caller may reuse its variables
 * as with an eager launch. At the region's end, a cached graph recorded
 * from the same sequence of operations (same kinds, same kernels) needs
 * only the nodes whose parameters differ set anew - usually none, or a
 * pointer or two - which costs far less than capturing and updating the
 * whole graph. Otherwise a graph is built from the record, one node after
 * the other, and instantiated (graph.c decides which).
 *
 * Anything else inside a region (host functions, allocation, pageable host
 * memory, the raw stream handed to a library) turns the region into a
 * stream capture: what was recorded so far is enqueued on the capture
 * stream, and the capture records the rest.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/lock.h"
#include "cuda/backend.h"

/* ---- kernel parameter tables ------------------------------------------- */

enum {
    MAX_KERNELS = 4096, /* distinct kernels recorded; beyond, regions are captured */
    MAX_PARAMS = 128,
    ARG_ALIGN = 16, /* each recorded argument starts at such an offset */
};

typedef struct param_layout {
    unsigned count;
    size_t bytes;              /* all arguments, packed at ARG_ALIGN */
    uint32_t size[MAX_PARAMS]; /* of each argument */
    uint32_t at[MAX_PARAMS];   /* its offset in the packed arguments */
} param_layout;

/* An open-addressed table, read without a lock: an entry's kernel is
 * published after its layout, and entries are never removed. */
static struct {
    _Atomic(const void *) kernel;
    const param_layout *layout;
} kernels[MAX_KERNELS];
static weft__lock kernels_lock;

typedef CUresult (*param_info_fn)(CUfunction f, size_t index, size_t *offset, size_t *size);
static param_info_fn param_info; /* cuFuncGetParamInfo, CUDA 12.4 on */
static pthread_once_t param_info_once = PTHREAD_ONCE_INIT;

static void load_param_info(void)
{
    enum cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuFuncGetParamInfo", (void **)&param_info, 12040,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
        param_info = NULL;
    cudaGetLastError();
}

static size_t kernel_slot(const void *kernel)
{
    uintptr_t h = (uintptr_t)kernel;
    h ^= h >> 17;
    h *= 0xed5ad4bbu;
    return (size_t)(h ^ (h >> 11)) % MAX_KERNELS;
}

/* Ask the driver for kernel's parameters. *layout stays NULL when the
 * driver cannot say (too old) or the kernel has too many: such regions are
 * captured instead. */
static int describe(const void *kernel, param_layout **layout)
{
    *layout = NULL;
    pthread_once(&param_info_once, load_param_info);
    if (!param_info)
        return WEFT_OK;
    cudaFunction_t f;
    cudaError_t e = cudaGetFuncBySymbol(&f, kernel);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return weft__fail(WEFT_EINVAL, "weft_launch: cudaGetFuncBySymbol: %s (not a kernel?)",
                          cudaGetErrorName(e));
    }
    param_layout *p = calloc(1, sizeof *p);
    if (!p)
        return weft__fail(WEFT_ENOMEM, "weft_launch: out of memory");
    for (size_t i = 0;; i++) {
        size_t offset, size;
        CUresult r = param_info((CUfunction)f, i, &offset, &size);
        if (r == CUDA_ERROR_INVALID_VALUE) /* past the last parameter */
            break;
        if (r != CUDA_SUCCESS || i == MAX_PARAMS) {
            free(p);
            return WEFT_OK;
        }
        p->at[i] = (uint32_t)p->bytes;
        p->size[i] = (uint32_t)size;
        p->bytes += (size + ARG_ALIGN - 1) / ARG_ALIGN * ARG_ALIGN;
        p->count = (unsigned)i + 1;
    }
    *layout = p;
    return WEFT_OK;
}

/* kernel's layout, described on first use; NULL (and WEFT_OK) when it
 * cannot be recorded. */
static int layout_of(const void *kernel, const param_layout **out)
{
    size_t first = kernel_slot(kernel);
    for (size_t i = first, n = 0; n < MAX_KERNELS; i = (i + 1) % MAX_KERNELS, n++) {
        const void *k = atomic_load_explicit(&kernels[i].kernel, memory_order_acquire);
        if (k == kernel) {
            *out = kernels[i].layout;
            return WEFT_OK;
        }
        if (!k)
            break;
    }
    weft__lock_acquire(&kernels_lock);
    size_t i = first, n = 0;
    for (; n < MAX_KERNELS; i = (i + 1) % MAX_KERNELS, n++) {
        const void *k = atomic_load_explicit(&kernels[i].kernel, memory_order_relaxed);
        if (k == kernel || !k)
            break;
    }
    int rc = WEFT_OK;
    *out = NULL;
    if (n == MAX_KERNELS) { /* full: such launches are captured */
    } else if (atomic_load_explicit(&kernels[i].kernel, memory_order_relaxed) == kernel) {
        *out = kernels[i].layout;
    } else {
        param_layout *p = NULL;
        rc = describe(kernel, &p);
        if (rc == WEFT_OK) { /* remembered even when NULL: ask the driver once */
            kernels[i].layout = p;
            atomic_store_explicit(&kernels[i].kernel, kernel, memory_order_release);
            *out = p;
        }
    }
    weft__lock_release(&kernels_lock);
    return rc;
}

/* ---- the record -------------------------------------------------------- */

typedef enum rec_kind { REC_KERNEL, REC_FILL, REC_COPY } rec_kind;

typedef struct rec_op {
    rec_kind kind;
    const void *kernel; /* REC_KERNEL */
    const param_layout *layout;
    dim3 grid, block;
    size_t shared_bytes;
    size_t args_at; /* its packed arguments, in the record's args */
    void *dst;      /* REC_FILL, REC_COPY */
    const void *src;
    size_t n;
    int value;
} rec_op;

struct weft__cuda_record {
    rec_op *ops;
    unsigned nops, ops_cap;
    unsigned char *args;
    size_t nargs, args_cap;
};

weft__cuda_record *weft__cuda_record_new(void)
{
    return calloc(1, sizeof(weft__cuda_record));
}

void weft__cuda_record_free(weft__cuda_record *r)
{
    if (r) {
        free(r->ops);
        free(r->args);
        free(r);
    }
}

void weft__cuda_record_reset(weft__cuda_record *r)
{
    r->nops = 0;
    r->nargs = 0;
}

unsigned weft__cuda_record_length(const weft__cuda_record *r)
{
    return r->nops;
}

static rec_op *append(weft__cuda_record *r, size_t arg_bytes)
{
    if (r->nops == r->ops_cap) {
        unsigned cap = r->ops_cap ? 2 * r->ops_cap : 32;
        rec_op *ops = realloc(r->ops, cap * sizeof *ops);
        if (!ops)
            return NULL;
        r->ops = ops;
        r->ops_cap = cap;
    }
    if (r->nargs + arg_bytes > r->args_cap) {
        size_t cap = r->args_cap ? 2 * r->args_cap : 4096;
        while (cap < r->nargs + arg_bytes)
            cap *= 2;
        unsigned char *args = realloc(r->args, cap);
        if (!args)
            return NULL;
        r->args = args;
        r->args_cap = cap;
    }
    rec_op *op = &r->ops[r->nops++];
    memset(op, 0, sizeof *op);
    op->args_at = r->nargs;
    r->nargs += arg_bytes;
    return op;
}

int weft__cuda_record_launch(weft__cuda_record *r, const void *kernel, weft_dim3 grid,
                             weft_dim3 block, size_t shared_bytes, void **args)
{
    const param_layout *p;
    int rc = layout_of(kernel, &p);
    if (rc)
        return rc;
    if (!p)
        return WEFT__CUDA_NOT_RECORDED;
    if (p->count && !args)
        return weft__fail(WEFT_EINVAL,
                          "weft_launch: args is NULL for a kernel with %u "
                          "parameters",
                          p->count);
    rec_op *op = append(r, p->bytes);
    if (!op)
        return weft__fail(WEFT_ENOMEM, "weft_launch: out of memory recording a region");
    op->kind = REC_KERNEL;
    op->kernel = kernel;
    op->layout = p;
    op->grid = (dim3){grid.x, grid.y, grid.z};
    op->block = (dim3){block.x, block.y, block.z};
    op->shared_bytes = shared_bytes;
    unsigned char *bytes = r->args + op->args_at;
    memset(bytes, 0, p->bytes); /* padding too, so records compare bytewise */
    for (unsigned i = 0; i < p->count; i++)
        memcpy(bytes + p->at[i], args[i], p->size[i]);
    return WEFT_OK;
}

int weft__cuda_record_fill(weft__cuda_record *r, void *dst, int value, size_t n)
{
    rec_op *op = append(r, 0);
    if (!op)
        return weft__fail(WEFT_ENOMEM, "weft_memset_async: out of memory recording a region");
    op->kind = REC_FILL;
    op->dst = dst;
    op->value = (unsigned char)value; /* what cudaMemsetAsync stores */
    op->n = n;
    return WEFT_OK;
}

int weft__cuda_record_copy(weft__cuda_record *r, void *dst, const void *src, size_t n)
{
    rec_op *op = append(r, 0);
    if (!op)
        return weft__fail(WEFT_ENOMEM, "weft_memcpy_async: out of memory recording a region");
    op->kind = REC_COPY;
    op->dst = dst;
    op->src = src;
    op->n = n;
    return WEFT_OK;
}

/* ---- turning a record into work ----------------------------------------- */

/* The argument pointers cudaLaunchKernel and kernel nodes take. */
static void arg_pointers(const weft__cuda_record *r, const rec_op *op, void **ptrs)
{
    for (unsigned i = 0; i < op->layout->count; i++)
        ptrs[i] = r->args + op->args_at + op->layout->at[i];
}

static struct cudaKernelNodeParams kernel_params(const rec_op *op, void **ptrs)
{
    return (struct cudaKernelNodeParams){
        .func = (void *)op->kernel,
        .gridDim = op->grid,
        .blockDim = op->block,
        .sharedMemBytes = (unsigned)op->shared_bytes,
        .kernelParams = ptrs,
    };
}

static struct cudaMemsetParams fill_params(const rec_op *op)
{
    return (struct cudaMemsetParams){
        .dst = op->dst,
        .value = (unsigned)op->value,
        .elementSize = 1,
        .width = op->n,
        .height = 1,
    };
}

cudaError_t weft__cuda_record_enqueue(const weft__cuda_record *r, cudaStream_t stream)
{
    void *ptrs[MAX_PARAMS];
    cudaError_t e = cudaSuccess;
    for (unsigned i = 0; i < r->nops && e == cudaSuccess; i++) {
        const rec_op *op = &r->ops[i];
        switch (op->kind) {
        case REC_KERNEL:
            arg_pointers(r, op, ptrs);
            e = cudaLaunchKernel(op->kernel, op->grid, op->block, ptrs, op->shared_bytes, stream);
            break;
        case REC_FILL:
            e = cudaMemsetAsync(op->dst, op->value, op->n, stream);
            break;
        case REC_COPY:
            e = cudaMemcpyAsync(op->dst, op->src, op->n, cudaMemcpyDefault, stream);
            break;
        }
    }
    return e;
}

cudaError_t weft__cuda_record_build(const weft__cuda_record *r, cudaGraph_t *graph,
                                    cudaGraphNode_t **nodes_out)
{
    void *ptrs[MAX_PARAMS];
    cudaGraphNode_t *nodes = malloc(r->nops * sizeof *nodes);
    *graph = NULL;
    *nodes_out = NULL;
    if (!nodes)
        return cudaErrorMemoryAllocation;
    cudaError_t e = cudaGraphCreate(graph, 0);
    for (unsigned i = 0; i < r->nops && e == cudaSuccess; i++) {
        const rec_op *op = &r->ops[i];
        const cudaGraphNode_t *dep = i ? &nodes[i - 1] : NULL; /* a chain, like a stream */
        size_t ndeps = i ? 1 : 0;
        switch (op->kind) {
        case REC_KERNEL: {
            arg_pointers(r, op, ptrs);
            struct cudaKernelNodeParams kp = kernel_params(op, ptrs);
            e = cudaGraphAddKernelNode(&nodes[i], *graph, dep, ndeps, &kp);
            break;
        }
        case REC_FILL: {
            struct cudaMemsetParams mp = fill_params(op);
            e = cudaGraphAddMemsetNode(&nodes[i], *graph, dep, ndeps, &mp);
            break;
        }
        case REC_COPY:
            e = cudaGraphAddMemcpyNode1D(&nodes[i], *graph, dep, ndeps, op->dst, op->src, op->n,
                                         cudaMemcpyDefault);
            break;
        }
    }
    if (e != cudaSuccess) {
        if (*graph)
            cudaGraphDestroy(*graph);
        *graph = NULL;
        free(nodes);
        return e;
    }
    *nodes_out = nodes;
    return cudaSuccess;
}

/* ---- replaying against a cached graph ----------------------------------- */

bool weft__cuda_record_same_shape(const weft__cuda_record *a, const weft__cuda_record *b)
{
    if (a->nops != b->nops)
        return false;
    for (unsigned i = 0; i < a->nops; i++)
        if (a->ops[i].kind != b->ops[i].kind || a->ops[i].kernel != b->ops[i].kernel)
            return false;
    return true;
}

static bool same_params(const weft__cuda_record *a, const rec_op *x, const weft__cuda_record *b,
                        const rec_op *y)
{
    switch (x->kind) {
    case REC_KERNEL:
        return x->grid.x == y->grid.x && x->grid.y == y->grid.y && x->grid.z == y->grid.z &&
               x->block.x == y->block.x && x->block.y == y->block.y && x->block.z == y->block.z &&
               x->shared_bytes == y->shared_bytes &&
               !memcmp(a->args + x->args_at, b->args + y->args_at, x->layout->bytes);
    case REC_FILL:
        return x->dst == y->dst && x->value == y->value && x->n == y->n;
    case REC_COPY:
        return x->dst == y->dst && x->src == y->src && x->n == y->n;
    }
    return false;
}

cudaError_t weft__cuda_record_apply(cudaGraphExec_t exec, const cudaGraphNode_t *nodes,
                                    const weft__cuda_record *was, const weft__cuda_record *now,
                                    unsigned *changed)
{
    void *ptrs[MAX_PARAMS];
    cudaError_t e = cudaSuccess;
    *changed = 0;
    for (unsigned i = 0; i < now->nops && e == cudaSuccess; i++) {
        const rec_op *op = &now->ops[i];
        if (same_params(was, &was->ops[i], now, op))
            continue;
        ++*changed;
        switch (op->kind) {
        case REC_KERNEL: {
            arg_pointers(now, op, ptrs);
            struct cudaKernelNodeParams kp = kernel_params(op, ptrs);
            e = cudaGraphExecKernelNodeSetParams(exec, nodes[i], &kp);
            break;
        }
        case REC_FILL: {
            struct cudaMemsetParams mp = fill_params(op);
            e = cudaGraphExecMemsetNodeSetParams(exec, nodes[i], &mp);
            break;
        }
        case REC_COPY:
            e = cudaGraphExecMemcpyNodeSetParams1D(exec, nodes[i], op->dst, op->src, op->n,
                                                   cudaMemcpyDefault);
            break;
        }
    }
    return e;
}

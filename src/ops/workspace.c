/*
 * workspace.c - one workspace per stream for the library calls weft makes
 * (cuBLASLt in matmul_cublaslt.c, cuDNN in conv_cudnn.c).
 *
 * A library's kernels use their workspace only while they run, and the
 * calls on one stream run one after another in its order, so a matmul and
 * a convolution on the same stream can share one block.
 *
 * Workspaces are keyed by CUDA's process-wide unique stream id
 * (cudaStreamGetId), so a stream handle reused after cudaStreamDestroy
 * never inherits a workspace another stream's work may still be using.
 * weft's own streams are pooled and live as long as the runtime, so their
 * number is bounded; past WEFT__MAX_WORKSPACES streams (a caller's, made
 * and destroyed in a loop) further streams get none, which both libraries
 * allow, on the algorithms that need none. So do calls captured into a
 * graph: a graph runs on whatever stream it is launched on, perhaps beside
 * another captured on the same stream, so no stream's workspace is safe
 * to hand it (the callers ask before calling here).
 *
 * Kept for the process's life; published records are never changed, so
 * lookups take no lock and only inserts do.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/lock.h"
#include "cuda/status.h"
#include "ops/workspace.h"

enum { BUCKETS = 512 };

typedef struct workspace {
    unsigned long long stream_id;
    int device;
    void *ptr;
    size_t size;
    struct workspace *next;
} workspace;

static _Atomic(workspace *) buckets[BUCKETS];
static weft__lock insert_lock = WEFT__LOCK_INIT;
static unsigned count; /* workspaces with memory; guarded by insert_lock */

static workspace *find(workspace *w, unsigned long long id, int device)
{
    for (; w; w = w->next)
        if (w->stream_id == id && w->device == device)
            return w;
    return NULL;
}

int weft__stream_workspace(const char *op, cudaStream_t stream, int device, void **ptr,
                           size_t *size)
{
    unsigned long long id;
    cudaError_t e = cudaStreamGetId(stream, &id);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* a refused call is not sticky: clear it */
        return weft__fail(weft__cuda_status(e), "%s: cudaStreamGetId failed: %s (%s)", op,
                          cudaGetErrorName(e), cudaGetErrorString(e));
    }
    _Atomic(workspace *) *bucket = &buckets[(id * 0x9e3779b97f4a7c15ull) >> 55];
    workspace *w = find(atomic_load_explicit(bucket, memory_order_acquire), id, device);
    if (w) {
        *ptr = w->ptr, *size = w->size;
        return WEFT_OK;
    }

    /* The stream's first library call: its own workspace, unless too many
     * streams have one already. */
    workspace *nw = calloc(1, sizeof *nw);
    if (!nw)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory for a workspace record", op);
    nw->stream_id = id, nw->device = device, nw->size = WEFT__WORKSPACE;
    weft__lock_acquire(&insert_lock);
    int full = count >= WEFT__MAX_WORKSPACES;
    weft__lock_release(&insert_lock);
    if (full) {
        nw->size = 0;
    } else if ((e = cudaMalloc(&nw->ptr, nw->size)) != cudaSuccess) {
        free(nw);
        cudaGetLastError();
        return weft__fail(WEFT_ENOMEM, "%s: no memory for a %d MiB workspace: %s", op,
                          WEFT__WORKSPACE >> 20, cudaGetErrorName(e));
    }
    weft__lock_acquire(&insert_lock);
    w = find(atomic_load_explicit(bucket, memory_order_relaxed), id, device);
    if (!w) {
        nw->next = atomic_load_explicit(bucket, memory_order_relaxed);
        atomic_store_explicit(bucket, nw, memory_order_release);
        count += nw->size != 0;
        w = nw, nw = NULL;
    }
    weft__lock_release(&insert_lock);
    if (nw) { /* the same stream raced us here: keep the first */
        cudaFree(nw->ptr);
        free(nw);
    }
    *ptr = w->ptr, *size = w->size;
    return WEFT_OK;
}

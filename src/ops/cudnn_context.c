/*
 * cudnn_context.c - the cuDNN handles and workspaces weft's cuDNN calls
 * share (weft_conv2d's, conv_cudnn.c).
 *
 * Kept for the process's life (a handful per thread and per stream);
 * lookups take no lock:
 *  - handles: one per thread and device. A handle carries its stream
 *    (cudnnSetStream), so one shared by threads would race between setting
 *    the stream and the call; a task's call runs on one worker thread from
 *    start to end, so a thread's own handle is never shared. They go with
 *    their thread (a key's destructor). Creating one switches the thread
 *    to relaxed stream capture, so a first call inside a captured region
 *    can make it.
 *  - workspaces: WEFT__CUDNN_WORKSPACE bytes per stream, keyed by CUDA's
 *    process-wide unique stream id (a stream handle reused after
 *    cudaStreamDestroy never inherits a workspace another stream's work may
 *    still use), as matmul_cublaslt.c keeps cuBLASLt's. weft's own streams
 *    are pooled, so their number is bounded; past
 *    WEFT__CUDNN_MAX_WORKSPACES streams (a caller's, made and destroyed in
 *    a loop) calls run with none, on algorithms that need none. Calls
 *    captured into a graph take none either (the caller's rule: a graph
 *    may run beside another captured on the same stream, so no stream's
 *    workspace is safe to hand it).
 */
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/lock.h"
#include "cuda/status.h"
#include "ops/cudnn_context.h"

enum {
    WORKSPACE = WEFT__CUDNN_WORKSPACE,
    MAX_WORKSPACES = WEFT__CUDNN_MAX_WORKSPACES,
    MAX_DEVICES = 64,
    BUCKETS = 256
};

static int cuda_fail(const char *op, const char *what, cudaError_t e)
{
    cudaGetLastError(); /* a refused call is not sticky: clear it */
    return weft__fail(weft__cuda_status(e), "%s: %s failed: %s (%s)", op, what, cudaGetErrorName(e),
                      cudaGetErrorString(e));
}

/* ---- handles, one per thread and device -------------------------------- */

typedef struct thread_handles {
    cudnnHandle_t h[MAX_DEVICES];
} thread_handles;

static pthread_key_t handles_key;
static pthread_once_t handles_once = PTHREAD_ONCE_INIT;
static int handles_key_rc;
static _Thread_local thread_handles *my_handles;

static void drop_handles(void *p)
{
    thread_handles *t = p;
    for (int d = 0; d < MAX_DEVICES; d++)
        if (t->h[d]) {
            /* its last stream may be gone already (a pooled one, at the
             * runtime's end): off it, then away */
            cudaSetDevice(d);
            cudnnSetStream(t->h[d], NULL);
            cudnnDestroy(t->h[d]);
        }
    free(t);
}

static void make_key(void)
{
    handles_key_rc = pthread_key_create(&handles_key, drop_handles);
}

int weft__cudnn_handle(const char *op, int device, cudnnHandle_t *out)
{
    if (device < 0 || device >= MAX_DEVICES)
        return weft__fail(WEFT_EINVAL, "%s: device %d is beyond the %d this build knows", op,
                          device, MAX_DEVICES);
    if (my_handles && my_handles->h[device]) {
        *out = my_handles->h[device];
        return WEFT_OK;
    }
    pthread_once(&handles_once, make_key);
    if (handles_key_rc != 0)
        return weft__fail(WEFT_EDEVICE, "%s: pthread_key_create failed", op);
    if (!my_handles) {
        thread_handles *t = calloc(1, sizeof *t);
        if (!t)
            return weft__fail(WEFT_ENOMEM, "%s: out of memory for cuDNN handles", op);
        if (pthread_setspecific(handles_key, t) != 0) {
            free(t);
            return weft__fail(WEFT_EDEVICE, "%s: pthread_setspecific failed", op);
        }
        my_handles = t;
    }
    cudnnHandle_t h = NULL;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudnnStatus_t s = cudnnCreate(&h);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (s != CUDNN_STATUS_SUCCESS)
        return weft__fail(s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                                  s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                              ? WEFT_ENOMEM
                              : WEFT_EDEVICE,
                          "%s: cudnnCreate failed: %s (%d)", op, cudnnGetErrorString(s), (int)s);
    my_handles->h[device] = h;
    *out = h;
    return WEFT_OK;
}

/* ---- workspaces, one per stream ---------------------------------------- */

typedef struct workspace {
    unsigned long long stream_id;
    int device;
    void *ptr;
    size_t size;
    struct workspace *next;
} workspace;

static _Atomic(workspace *) ws_buckets[BUCKETS];
static weft__lock ws_lock = WEFT__LOCK_INIT;
static unsigned ws_count; /* guarded by ws_lock */

static workspace *ws_find(workspace *w, unsigned long long id, int device)
{
    for (; w; w = w->next)
        if (w->stream_id == id && w->device == device)
            return w;
    return NULL;
}

int weft__cudnn_workspace(const char *op, cudaStream_t stream, int device, void **ptr, size_t *size)
{
    unsigned long long id;
    cudaError_t e = cudaStreamGetId(stream, &id);
    if (e != cudaSuccess)
        return cuda_fail(op, "cudaStreamGetId", e);
    _Atomic(workspace *) *bucket = &ws_buckets[(id * 0x9e3779b97f4a7c15ull) >> 56];
    workspace *w = ws_find(atomic_load_explicit(bucket, memory_order_acquire), id, device);
    if (w) {
        *ptr = w->ptr, *size = w->size;
        return WEFT_OK;
    }
    workspace *nw = calloc(1, sizeof *nw);
    if (!nw)
        return weft__fail(WEFT_ENOMEM, "%s: out of memory for a workspace record", op);
    nw->stream_id = id, nw->device = device, nw->size = WORKSPACE;
    weft__lock_acquire(&ws_lock);
    int full = ws_count >= MAX_WORKSPACES;
    weft__lock_release(&ws_lock);
    if (full) {
        nw->size = 0;
    } else {
        e = cudaMalloc(&nw->ptr, nw->size); /* never under capture: see the call */
        if (e != cudaSuccess) {
            free(nw);
            cudaGetLastError();
            return weft__fail(WEFT_ENOMEM, "%s: no memory for a %d MiB workspace: %s", op,
                              WORKSPACE >> 20, cudaGetErrorName(e));
        }
    }
    weft__lock_acquire(&ws_lock);
    w = ws_find(atomic_load_explicit(bucket, memory_order_relaxed), id, device);
    if (!w) {
        nw->next = atomic_load_explicit(bucket, memory_order_relaxed);
        atomic_store_explicit(bucket, nw, memory_order_release);
        ws_count += nw->size != 0;
        w = nw, nw = NULL;
    }
    weft__lock_release(&ws_lock);
    if (nw) { /* the same stream raced us here: keep the first */
        cudaFree(nw->ptr);
        free(nw);
    }
    *ptr = w->ptr, *size = w->size;
    return WEFT_OK;
}

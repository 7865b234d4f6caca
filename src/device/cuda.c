/*
 * cuda.c - the CUDA backend: one weft device per GPU.
 *
 * Streams are non-blocking CUDA streams from a pool per priority class. Each
 * stream owns a completion word in mapped, page-locked host memory; a
 * completion marker is a cuStreamWriteValue32 of the stream's next sequence
 * number into it (the GPU writes it once everything before it is done, after
 * a memory fence, so the data it covers is visible first). Markers on a
 * stream complete in order, so the completion engine (cuda_poll, run by
 * idle workers) reads one word per active stream and compares it with the
 * sequence number of the stream's first pending waiter only.
 *
 * Faults silence completion words: after a sticky error (an illegal address
 * in a kernel, say) the GPU writes nothing more. So the engine also queries
 * the active streams every BACKSTOP_NS; a sticky error marks the device
 * failed, ends every pending wait with WEFT_EDEVICE, and makes every later
 * call on this device fail at once. The runtime and other devices go on.
 *
 * The driver calls (stream memory operations) come through the runtime's
 * cudaGetDriverEntryPointByVersion, so the library links the CUDA runtime
 * only and loads on machines without a GPU driver (and then finds no GPU).
 */
#include "device/device.h"

#ifndef WEFT_HAVE_CUDA

int weft__cuda_devices_create(weft__device ***devs, unsigned *count)
{
    *devs = NULL;
    *count = 0;
    return WEFT_OK;
}

#else

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/lock.h"
#include "device/cuda_memory.h"

enum {
    MAX_STREAMS = 256,        /* per priority class; beyond, leases share */
    FLAG_STRIDE = 16,         /* words between completion flags: a cache line each */
    BACKSTOP_NS = 10000000,   /* fault check period while waits are pending */
    BACKSTOP_QUERIES = 16,    /* streams queried per period */
};

typedef CUresult (*stream_mem_op_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

typedef struct cuda_device cuda_device;

/* A wait for a stream to reach a sequence number; on the waiter's stack. */
typedef struct marker {
    weft__waiter w;
    uint64_t seq;
} marker;

struct weft__stream {
    _Alignas(64) weft__lock lock; /* guards marked and pending */
    cudaStream_t handle;
    cuda_device *dev;
    volatile uint32_t *flag;  /* written by the GPU */
    CUdeviceptr flag_device;
    uint64_t marked;          /* last sequence number enqueued */
    weft__waitq pending;      /* markers, in sequence order */
    bool active;              /* on dev->active (changed holding both locks) */
    unsigned leases;          /* guarded by dev->pool_lock */
    int class_;               /* 0 normal and low, 1 high */
};

struct cuda_device {
    weft__device base; /* first: the core sees only this */
    int ordinal;
    int priority[2];   /* CUDA stream priority of each class */

    weft__lock pool_lock;
    weft__stream *streams[2][MAX_STREAMS];
    unsigned nstreams[2];
    unsigned next_shared[2];
    atomic_uint leased;

    uint32_t *flags;   /* 2 * MAX_STREAMS completion words, mapped */
    CUdeviceptr flags_device;

    weft__lock active_lock; /* guards active; also keeps one poller at a time */
    weft__stream *active[2 * MAX_STREAMS];
    unsigned nactive;
    atomic_uint npending;   /* markers waiting, all streams */
    atomic_int failed;      /* the sticky cudaError_t, 0 while healthy */
    uint64_t last_backstop;
    unsigned next_query;    /* the backstop's turn among active streams */

    weft__cuda_host_pool host_pool;
};

static stream_mem_op_fn write_value, wait_value;

static cuda_device *cuda_of(weft__device *d)
{
    return (cuda_device *)d;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- errors ------------------------------------------------------------ */

/* Errors after which the context is unusable: the device has failed. */
static bool sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
        return true;
    default:
        return false;
    }
}

/* Turn a CUDA error from call into a weft status with the error's name in
 * the message; a sticky one marks the device failed. */
static int cuda_fail(cuda_device *dev, const char *call, cudaError_t e)
{
    cudaGetLastError(); /* clear the thread's record of a non-sticky error */
    if (sticky(e)) {
        int healthy = 0;
        atomic_compare_exchange_strong(&dev->failed, &healthy, (int)e);
    }
    int status = e == cudaErrorMemoryAllocation ? WEFT_ENOMEM
                 : e == cudaErrorInvalidValue || e == cudaErrorInvalidConfiguration ||
                         e == cudaErrorInvalidDeviceFunction
                     ? WEFT_EINVAL
                     : WEFT_EDEVICE;
    return weft__fail(status, "%s: %s (%s) on GPU %d", call, cudaGetErrorName(e),
                      cudaGetErrorString(e), dev->ordinal);
}

static int check_failed(cuda_device *dev, const char *call)
{
    int e = atomic_load_explicit(&dev->failed, memory_order_relaxed);
    if (e == 0)
        return WEFT_OK;
    return weft__fail(WEFT_EDEVICE, "%s: GPU %d has failed: %s", call, dev->ordinal,
                      cudaGetErrorName((cudaError_t)e));
}

/* The calling thread's current device, set only when it changes. Never
 * inlined: tasks move between threads. */
static _Thread_local int current_ordinal = -1;

__attribute__((noinline)) static int use_device(cuda_device *dev)
{
    if (current_ordinal == dev->ordinal)
        return WEFT_OK;
    cudaError_t e = cudaSetDevice(dev->ordinal);
    if (e != cudaSuccess)
        return cuda_fail(dev, "cudaSetDevice", e);
    current_ordinal = dev->ordinal;
    return WEFT_OK;
}

/* Before any enqueue: the device must be healthy and current. */
static int enter(weft__stream *s, const char *call)
{
    int rc = check_failed(s->dev, call);
    return rc ? rc : use_device(s->dev);
}

/* ---- operations -------------------------------------------------------- */

/* Pageable host memory: CUDA reads it at enqueue time (host to device) or
 * synchronizes (device to host), which breaks stream order. */
static bool pageable(const void *p)
{
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError();
        return true;
    }
    return attr.type == cudaMemoryTypeUnregistered;
}

/* A host-side copy run in stream order by a host function; when stage is
 * set, it goes back to the pool afterwards. */
typedef struct host_copy {
    void *dst;
    const void *src;
    size_t n;
    void *stage;
    weft__cuda_host_pool *pool;
} host_copy;

static void CUDART_CB run_host_copy(void *arg)
{
    host_copy *c = arg;
    memcpy(c->dst, c->src, c->n);
    if (c->stage)
        weft__cuda_host_pool_put_cached(c->pool, c->stage);
    free(c);
}

static int enqueue_host_copy(weft__stream *s, void *dst, const void *src, size_t n, void *stage)
{
    host_copy *c = malloc(sizeof *c);
    if (!c)
        return weft__fail(WEFT_ENOMEM, "weft_memcpy_async: out of memory");
    *c = (host_copy){dst, src, n, stage, &s->dev->host_pool};
    cudaError_t e = cudaLaunchHostFunc(s->handle, run_host_copy, c);
    if (e != cudaSuccess) {
        free(c);
        return cuda_fail(s->dev, "cudaLaunchHostFunc", e);
    }
    return WEFT_OK;
}

/* Copies touching pageable memory go through a pinned staging buffer, with
 * the host side done by host functions, so that every copy keeps its place
 * in the stream. */
static int cuda_copy(weft__stream *s, void *dst, const void *src, size_t n)
{
    int rc = enter(s, "weft_memcpy_async");
    if (rc)
        return rc;
    bool from_pageable = pageable(src), to_pageable = pageable(dst);
    if (from_pageable && to_pageable)
        return enqueue_host_copy(s, dst, src, n, NULL);
    void *stage = NULL;
    if ((from_pageable || to_pageable) &&
        (rc = weft__cuda_host_pool_get(&s->dev->host_pool, n, &stage)))
        return rc;
    if (from_pageable && (rc = enqueue_host_copy(s, stage, src, n, NULL))) {
        weft__cuda_host_pool_put_cached(&s->dev->host_pool, stage); /* nothing uses it */
        return rc;
    }
    cudaError_t e = cudaMemcpyAsync(to_pageable ? stage : dst, from_pageable ? stage : src, n,
                                    cudaMemcpyDefault, s->handle);
    if (e != cudaSuccess) /* a host copy may be queued into stage: leave it be */
        return cuda_fail(s->dev, "cudaMemcpyAsync", e);
    if (!stage)
        return WEFT_OK;
    /* the last step gives the staging buffer back */
    if (to_pageable)
        return enqueue_host_copy(s, dst, stage, n, stage);
    return enqueue_host_copy(s, stage, stage, 0, stage);
}

typedef struct host_fill {
    void *dst;
    int value;
    size_t n;
} host_fill;

static void CUDART_CB run_host_fill(void *arg)
{
    host_fill *f = arg;
    memset(f->dst, f->value, f->n);
    free(f);
}

/* cudaMemsetAsync needs memory the device can address; pageable host
 * memory is filled by a host function in stream order instead. */
static int cuda_fill(weft__stream *s, void *dst, int value, size_t n)
{
    int rc = enter(s, "weft_memset_async");
    if (rc)
        return rc;
    struct cudaPointerAttributes attr;
    cudaError_t e = cudaPointerGetAttributes(&attr, dst);
    if (e == cudaSuccess && attr.type == cudaMemoryTypeUnregistered) {
        host_fill *f = malloc(sizeof *f);
        if (!f)
            return weft__fail(WEFT_ENOMEM, "weft_memset_async: out of memory");
        *f = (host_fill){dst, value, n};
        if ((e = cudaLaunchHostFunc(s->handle, run_host_fill, f)) != cudaSuccess) {
            free(f);
            return cuda_fail(s->dev, "cudaLaunchHostFunc", e);
        }
        return WEFT_OK;
    }
    e = cudaMemsetAsync(dst, value, n, s->handle);
    return e == cudaSuccess ? WEFT_OK : cuda_fail(s->dev, "cudaMemsetAsync", e);
}

static int cuda_host_fn(weft__stream *s, void (*fn)(void *arg), void *arg)
{
    int rc = enter(s, "weft_host_async");
    if (rc)
        return rc;
    cudaError_t e = cudaLaunchHostFunc(s->handle, fn, arg);
    return e == cudaSuccess ? WEFT_OK : cuda_fail(s->dev, "cudaLaunchHostFunc", e);
}

static int cuda_launch(weft__stream *s, const void *kernel, weft_dim3 grid, weft_dim3 block,
                       size_t shared_bytes, void **args)
{
    int rc = enter(s, "weft_launch");
    if (rc)
        return rc;
    dim3 g = {grid.x, grid.y, grid.z}, b = {block.x, block.y, block.z};
    cudaError_t e = cudaLaunchKernel(kernel, g, b, args, shared_bytes, s->handle);
    return e == cudaSuccess ? WEFT_OK : cuda_fail(s->dev, "cudaLaunchKernel", e);
}

static int cuda_malloc_async(weft__stream *s, void **ptr, size_t n)
{
    int rc = enter(s, "weft_malloc_async");
    if (rc)
        return rc;
    cudaError_t e = cudaMallocAsync(ptr, n, s->handle);
    return e == cudaSuccess ? WEFT_OK : cuda_fail(s->dev, "cudaMallocAsync", e);
}

static int cuda_free_async(weft__stream *s, void *ptr)
{
    int rc = enter(s, "weft_free_async");
    if (rc)
        return rc;
    cudaError_t e = cudaFreeAsync(ptr, s->handle);
    return e == cudaSuccess ? WEFT_OK : cuda_fail(s->dev, "cudaFreeAsync", e);
}

static void *cuda_native(weft__stream *s)
{
    return s->handle;
}

/* ---- markers and the completion engine ---------------------------------- */

/* Has the stream's completion word reached seq? Cyclic 32-bit compare, as
 * the GPU's own wait does. */
static bool reached(const weft__stream *s, uint64_t seq)
{
    uint32_t done = __atomic_load_n(s->flag, __ATOMIC_ACQUIRE);
    return (int32_t)(done - (uint32_t)seq) >= 0;
}

static int cuda_mark(weft__stream *s, uint64_t *seq)
{
    int rc = enter(s, "weft_await");
    if (rc)
        return rc;
    weft__lock_acquire(&s->lock);
    uint64_t next = s->marked + 1;
    CUresult r = write_value((CUstream)s->handle, s->flag_device, (cuuint32_t)next, 0);
    if (r == CUDA_SUCCESS)
        s->marked = next;
    weft__lock_release(&s->lock);
    if (r != CUDA_SUCCESS)
        return weft__fail(WEFT_EDEVICE, "cuStreamWriteValue32: driver error %d on GPU %d", (int)r,
                          s->dev->ordinal);
    *seq = next;
    return WEFT_OK;
}

/* Fire the markers s has reached (all of them, with status, if status is
 * a failure). Call with s->lock held. */
static unsigned fire_reached(weft__stream *s, int status)
{
    unsigned fired = 0;
    weft__waiter *w;
    while ((w = s->pending.head) != NULL) {
        marker *m = (marker *)((char *)w - offsetof(marker, w));
        if (status == WEFT_OK && !reached(s, m->seq))
            break;
        weft__waitq_pop(&s->pending);
        weft__waiter_fire(w, status); /* not cancellable: always taken */
        fired++;
    }
    atomic_fetch_sub(&s->dev->npending, fired);
    return fired;
}

/* Put s on the engine's list. Call with s->lock held: the lock order is
 * stream, then active_lock (the engine only try-locks streams). */
static void activate(cuda_device *dev, weft__stream *s)
{
    if (s->active)
        return;
    weft__lock_acquire(&dev->active_lock);
    s->active = true;
    dev->active[dev->nactive++] = s;
    weft__lock_release(&dev->active_lock);
}

static int cuda_wait(weft__stream *s, uint64_t seq)
{
    cuda_device *dev = s->dev;
    int rc = check_failed(dev, "weft_await");
    if (rc || reached(s, seq))
        return rc;

    marker m = {.seq = seq};
    weft__waiter_init(&m.w);
    weft__lock_acquire(&s->lock);
    if (reached(s, seq)) {
        weft__lock_release(&s->lock);
        return WEFT_OK;
    }
    weft__waitq_push(&s->pending, &m.w); /* markers complete in order: FIFO */
    bool first = atomic_fetch_add(&dev->npending, 1) == 0;
    activate(dev, s);
    if (first && dev->base.kick) /* nobody may be polling */
        dev->base.kick(dev->base.kick_ctx);
    rc = weft__waiter_wait(&m.w, &s->lock, false);
    if (rc == WEFT_EDEVICE)
        return check_failed(dev, "weft_await");
    return rc;
}

static int cuda_stream_wait(weft__stream *s, weft__stream *other, uint64_t seq)
{
    int rc = enter(s, "weft_stream_wait");
    if (rc)
        return rc;
    CUresult r = wait_value((CUstream)s->handle, other->flag_device, (cuuint32_t)seq,
                            CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS)
        return weft__fail(WEFT_EDEVICE, "cuStreamWaitValue32: driver error %d on GPU %d", (int)r,
                          s->dev->ordinal);
    return WEFT_OK;
}

/* The backstop: completion words never move after a fault, so ask CUDA.
 * A stream whose work is still running can answer "not ready" for seconds
 * after another stream faulted (seen on the H200), so each period queries
 * the next few active streams in turn. Call with active_lock held. */
static void backstop(cuda_device *dev)
{
    unsigned n = dev->nactive < BACKSTOP_QUERIES ? dev->nactive : BACKSTOP_QUERIES;
    for (unsigned i = 0; i < n && !atomic_load(&dev->failed); i++) {
        weft__stream *s = dev->active[dev->next_query++ % dev->nactive];
        cudaError_t e = cudaStreamQuery(s->handle);
        if (e != cudaSuccess && e != cudaErrorNotReady)
            cuda_fail(dev, "cudaStreamQuery", e);
    }
}

static unsigned cuda_poll(weft__device *d)
{
    cuda_device *dev = cuda_of(d);
    if (atomic_load_explicit(&dev->npending, memory_order_relaxed) == 0 ||
        !weft__lock_try(&dev->active_lock)) /* someone else is polling */
        return 0;
    uint64_t now = now_ns();
    if (now - dev->last_backstop >= BACKSTOP_NS) {
        dev->last_backstop = now;
        if (use_device(dev) == WEFT_OK)
            backstop(dev);
    }
    int status = atomic_load(&dev->failed) ? WEFT_EDEVICE : WEFT_OK;
    unsigned fired = 0;
    for (unsigned i = 0; i < dev->nactive;) {
        weft__stream *s = dev->active[i];
        if (!weft__lock_try(&s->lock)) { /* a waiter is linking in: next round */
            i++;
            continue;
        }
        fired += fire_reached(s, status);
        bool idle = s->pending.head == NULL;
        if (idle) {
            s->active = false;
            dev->active[i] = dev->active[--dev->nactive];
        } else {
            i++;
        }
        weft__lock_release(&s->lock);
    }
    weft__lock_release(&dev->active_lock);
    return fired;
}

static bool cuda_pending(weft__device *d)
{
    return atomic_load_explicit(&cuda_of(d)->npending, memory_order_relaxed) > 0;
}

/* ---- the stream pool ---------------------------------------------------- */

static int stream_create(cuda_device *dev, int class_, weft__stream **out)
{
    weft__stream *s;
    if (posix_memalign((void **)&s, 64, sizeof *s))
        return weft__fail(WEFT_ENOMEM, "weft: out of memory for a stream");
    memset(s, 0, sizeof *s);
    int rc = use_device(dev);
    cudaError_t e = cudaSuccess;
    if (rc == WEFT_OK &&
        (e = cudaStreamCreateWithPriority(&s->handle, cudaStreamNonBlocking,
                                          dev->priority[class_])) != cudaSuccess)
        rc = cuda_fail(dev, "cudaStreamCreateWithPriority", e);
    if (rc) {
        free(s);
        return rc;
    }
    unsigned slot = (unsigned)class_ * MAX_STREAMS + dev->nstreams[class_];
    s->dev = dev;
    s->class_ = class_;
    s->flag = dev->flags + slot * FLAG_STRIDE;
    s->flag_device = dev->flags_device + slot * FLAG_STRIDE * sizeof(uint32_t);
    *out = s;
    return WEFT_OK;
}

static int cuda_stream_lease(weft__device *d, int priority, weft__stream **out)
{
    cuda_device *dev = cuda_of(d);
    int class_ = priority == WEFT_PRIO_HIGH;
    int rc = check_failed(dev, "weft: stream lease");
    if (rc)
        return rc;

    weft__lock_acquire(&dev->pool_lock);
    weft__stream **pool = dev->streams[class_];
    unsigned n = dev->nstreams[class_];
    weft__stream *s = NULL;
    for (unsigned i = 0; i < n && !s; i++) /* a free stream */
        if (pool[i]->leases == 0)
            s = pool[i];
    if (!s && n < MAX_STREAMS && (rc = stream_create(dev, class_, &s)) == WEFT_OK)
        pool[dev->nstreams[class_]++] = s;
    if (!s && n == MAX_STREAMS) /* exhausted: share, in turn */
        s = pool[dev->next_shared[class_]++ % MAX_STREAMS];
    if (s)
        s->leases++;
    weft__lock_release(&dev->pool_lock);
    if (!s)
        return rc;
    atomic_fetch_add_explicit(&dev->leased, 1, memory_order_relaxed);
    *out = s;
    return WEFT_OK;
}

static void cuda_stream_return(weft__device *d, weft__stream *s)
{
    cuda_device *dev = cuda_of(d);
    weft__lock_acquire(&dev->pool_lock);
    s->leases--;
    weft__lock_release(&dev->pool_lock);
    atomic_fetch_sub_explicit(&dev->leased, 1, memory_order_relaxed);
}

static unsigned cuda_load(weft__device *d)
{
    return atomic_load_explicit(&cuda_of(d)->leased, memory_order_relaxed);
}

/* ---- host memory ------------------------------------------------------- */

static int cuda_host_alloc(weft__device *d, void **ptr, size_t n, bool mapped, void **device_ptr)
{
    cuda_device *dev = cuda_of(d);
    int rc = use_device(dev);
    if (rc == WEFT_OK)
        rc = weft__cuda_host_pool_get(&dev->host_pool, n, ptr);
    if (rc == WEFT_OK && mapped) {
        cudaError_t e = cudaHostGetDevicePointer(device_ptr, *ptr, 0);
        if (e != cudaSuccess) {
            weft__cuda_host_pool_put(&dev->host_pool, *ptr);
            return cuda_fail(dev, "cudaHostGetDevicePointer", e);
        }
    }
    return rc;
}

static int cuda_host_free(weft__device *d, void *ptr)
{
    return weft__cuda_host_pool_put(&cuda_of(d)->host_pool, ptr);
}

/* ---- life cycle -------------------------------------------------------- */

static void cuda_destroy(weft__device *d)
{
    cuda_device *dev = cuda_of(d);
    cudaSetDevice(dev->ordinal);
    for (int c = 0; c < 2; c++)
        for (unsigned i = 0; i < dev->nstreams[c]; i++) {
            cudaStreamSynchronize(dev->streams[c][i]->handle); /* errors: nothing to do */
            cudaStreamDestroy(dev->streams[c][i]->handle);
            free(dev->streams[c][i]);
        }
    weft__cuda_host_pool_destroy(&dev->host_pool);
    if (dev->flags)
        cudaFreeHost(dev->flags);
    cudaGetLastError();
    free(dev);
}

static const weft__device_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .stream_lease = cuda_stream_lease,
    .stream_return = cuda_stream_return,
    .load = cuda_load,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .host_fn = cuda_host_fn,
    .launch = cuda_launch,
    .malloc_async = cuda_malloc_async,
    .free_async = cuda_free_async,
    .mark = cuda_mark,
    .wait = cuda_wait,
    .stream_wait = cuda_stream_wait,
    .native = cuda_native,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .poll = cuda_poll,
    .pending = cuda_pending,
};

static int device_create(int ordinal, weft__device **out)
{
    cuda_device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return weft__fail(WEFT_ENOMEM, "weft: out of memory for a device");
    dev->base.ops = &cuda_ops;
    dev->ordinal = ordinal;
    cudaError_t e;
    size_t flags_bytes = 2 * MAX_STREAMS * FLAG_STRIDE * sizeof(uint32_t);
    int least, greatest;
    /* weft never waits in a synchronous CUDA call on its hot path; when the
     * driver must wait anyway (a launch into a full queue, the user's own
     * cudaMemcpy), it should sleep rather than spin a core. */
    if ((e = cudaSetDevice(ordinal)) != cudaSuccess ||
        (e = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)) != cudaSuccess ||
        (e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess ||
        (e = cudaHostAlloc((void **)&dev->flags, flags_bytes,
                           cudaHostAllocMapped | cudaHostAllocPortable)) != cudaSuccess ||
        (e = cudaHostGetDevicePointer((void **)&dev->flags_device, dev->flags, 0)) !=
            cudaSuccess) {
        int rc = cuda_fail(dev, "weft: opening the GPU", e);
        cuda_destroy(&dev->base);
        return rc;
    }
    memset(dev->flags, 0, flags_bytes);
    dev->priority[0] = least;
    dev->priority[1] = greatest;
    current_ordinal = ordinal;
    weft__cuda_host_pool_init(&dev->host_pool);
    *out = &dev->base;
    return WEFT_OK;
}

static int load_driver_calls(void)
{
    enum cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", (void **)&write_value, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess ||
        cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", (void **)&wait_value, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return weft__fail(WEFT_EDEVICE, "weft: the CUDA driver has no stream memory operations");
    }
    return WEFT_OK;
}

int weft__cuda_devices_create(weft__device ***out, unsigned *count)
{
    *out = NULL;
    *count = 0;
    /* More streams than hardware queues would serialize independent work;
     * this must be set before the CUDA context exists. The user's wins. */
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        cudaGetLastError();
        return WEFT_OK; /* no GPU (or no driver): the host backend serves */
    }
    int rc = load_driver_calls();
    if (rc)
        return rc;
    weft__device **devs = calloc((size_t)n, sizeof *devs);
    if (!devs)
        return weft__fail(WEFT_ENOMEM, "weft: out of memory");
    for (int i = 0; i < n; i++)
        if ((rc = device_create(i, &devs[i]))) {
            while (i-- > 0)
                cuda_destroy(devs[i]);
            free(devs);
            return rc;
        }
    *out = devs;
    *count = (unsigned)n;
    return WEFT_OK;
}

#endif
